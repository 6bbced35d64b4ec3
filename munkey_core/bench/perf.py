"""`munkey bench perf`: deletion, search, inference, training and memory at scale, against baselines.

Sections (each prints a markdown table of absolute figures and same-run ratios):
- deletion: one id and a batch of 1,000 ids from banks of 10k / 100k / 1M rows (1280-d keys, 128-d
  exemplars, two AdamW moment rows), BankStore (durable, physical, index updated) vs FAISS
  `IndexIDMap2(IndexFlatIP)` `remove_ids` (in memory only) and, up to 100k, MemoryBank + npz save;
- forget: the storage part of a whole `munkey forget` request on synthetic run directories with 10
  checkpoints, run format 1 (bank.npz + checkpoints rewritten) vs format 2 (row files purged in
  place), bench/forget_storage.py;
- search: exact top-10 latency / throughput (BankStore, FAISS flat) and the IVF index's recall@10;
- search (its own section): the product's search path (bank/search.py, exact vs IVF in one run) and
  one image's predict at each size, recall@10, the index build and deletions (bench/search.py),
  plus recall@10 on a real run's own keys with `--run RUN`;
- inference: images/s of the K-ensemble (K = 1, 4, 8, 16) vs a plain timm ViT of the same backbone,
  and the late-injection variant;
- training: seconds per epoch of MUNKEY vs the plain ViT on the same images;
- memory: bytes per stored sample (fp32, fp16) and peak RSS of training and of serving.
Keys are synthetic and clustered (1,000 centres plus noise, unit norm): deletion and exact-search
cost do not depend on the values, IVF recall does (real embeddings are clustered too).
Memory: one bank at a time; at 1M rows the store file is 6.7 GB (page cache) and FAISS holds 5.1 GB.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import shutil
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from munkey_core.bench._common import KEY_DIM, VALUE_DIM, chunks, table

HELP = "deletion, forget requests, search, inference, training and memory at scale vs baselines"



def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sizes", default="10000,100000,1000000", help="bank sizes for deletion/search (comma list)")
    p.add_argument("--quick", action="store_true", help="fewer repetitions, sizes 10k,100k, K up to 8, short training")
    p.add_argument("--sections", default="deletion,forget,search,inference,training,memory",
                   help="comma list of: deletion, forget, search, inference, training, memory")
    p.add_argument("--run", default=None, help="search section: also recall@10 of IVF vs exact on this run's own "
                   "validation and test keys (real keys; the synthetic ones are optimistic)")
    p.add_argument("--legacy-max", type=int, default=100_000,
                   help="forget section: largest bank measured in run format 1 (it holds the bank in RAM)")
    p.add_argument("--workdir", default=None, help="where the bank files go (default: a temporary directory)")
    p.add_argument("--out", default=None, help="also write the tables (markdown) to this file")
    p.add_argument("--seed", type=int, default=0)


# ---------------------------------------------------------------- helpers
def _median_ms(times: list[float]) -> float:
    return 1e3 * statistics.median(times)


def _timeit(fn, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def _build_store(path: Path, n: int, seed: int, dtype: str = "float32"):
    import numpy as np

    from munkey_core.bank.store import BankStore

    store = BankStore.create(path, capacity=n, key_dim=KEY_DIM, value_dim=VALUE_DIM,
                             moment_names=["exp_avg", "exp_avg_sq"], dtype=dtype)
    for ids, keys in chunks(n, seed):
        rng = np.random.default_rng(int(ids[0]) + 1)
        v = rng.standard_normal((len(ids), VALUE_DIM), dtype=np.float32) * np.float32(0.02)
        store.append(ids, ids % 10, keys, v, {"exp_avg": v * np.float32(0.1), "exp_avg_sq": v * v})
    return store


# ---------------------------------------------------------------- deletion and search
def bench_deletion(sizes: list[int], quick: bool, seed: int, workdir: Path) -> list[str]:
    import faiss
    import numpy as np
    import torch

    from munkey_core.bank.ann import IVFIndex
    from munkey_core.bank.memory import MemoryBank

    faiss.omp_set_num_threads(1)
    rng = np.random.default_rng(seed + 7)
    held_out = np.concatenate([k for _, k in chunks(20_000, seed, start_id=10**9)])  # never in a bank
    queries = torch.from_numpy(held_out[:256].copy())
    del_rows, search_rows, ann_rows = [], [], []
    for n in sizes:
        print(f"[perf] bank of {n:,} rows: building the store ...", flush=True)
        d = workdir / f"bank_{n}"
        d.mkdir(parents=True, exist_ok=True)
        store = _build_store(d / "bank.store", n, seed)
        # IVF index (rows only) on held-out centroids; it follows every deletion below
        nlist = max(16, int(round(n ** 0.5)))
        t = time.perf_counter()
        index = IVFIndex.fit(store, held_out[256:], nlist=nlist, nprobe=8)
        ivf_build = time.perf_counter() - t
        # exact search
        store.search(queries[:1], 10)
        t1 = _timeit(lambda: store.search(queries[:1], 10), 3 if n >= 10**6 else 10)
        tb = _timeit(lambda: store.search(queries, 10), 1)
        _, exact = store.search(queries, 10)
        for nprobe in (8, 32):
            got = index.search(queries, 10, nprobe=nprobe)[1]
            recall = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(exact.numpy(), got.numpy())]))
            ts = _timeit(lambda: index.search(queries[:1], 10, nprobe=nprobe), 5 if n >= 10**6 else 20)
            tq = _timeit(lambda: index.search(queries[:64], 10, nprobe=nprobe), 1)[0]
            ann_rows.append([n, nlist, nprobe, recall, _median_ms(ts), 64 / tq, round(ivf_build, 1)])
        store_search = (_median_ms(t1), 256 / tb[0])
        # single deletions (durable, physical, IVF updated)
        reps = 20 if quick else 50
        victims = rng.choice(n, 2 * reps + 1000 * (2 if quick else 3), replace=False)
        single = _timeit_each(store.delete, [[int(v)] for v in victims[:reps]])
        store.fsync = lambda fd: None  # the same work without the device's flush, to show it is flat
        nosync = _timeit_each(store.delete, [[int(v)] for v in victims[reps:2 * reps]])
        store.fsync = os.fdatasync
        victims = np.concatenate([victims[:reps], victims[2 * reps:]])
        batches = [victims[reps + 1000 * i: reps + 1000 * (i + 1)].tolist() for i in range(2 if quick else 3)]
        batch = _timeit_each(store.delete, batches)
        # the purge is physical: the vacated tail is zero and no deleted id is retrievable
        tail_zero = not np.any(store.vacated_keys(1000))
        gone = not (set(store.ids[store.search(queries[:8], 50)[1].numpy()].ravel().tolist()) & set(victims.tolist()))
        scanned = "n/a"
        if n <= 100_000:
            blob = (d / "bank.store").read_bytes()
            first = next(chunks(n, seed))[1]
            probes = [first[v] for v in victims[:reps] if v < len(first)][:5]
            scanned = "yes" if probes and all(p.tobytes() not in blob for p in probes) else "NO"
            del blob
        store.close()
        del store, index
        gc.collect()
        # FAISS flat with ids: the same rows
        print(f"[perf] bank of {n:,} rows: FAISS ...", flush=True)
        fx = faiss.IndexIDMap2(faiss.IndexFlatIP(KEY_DIM))
        for ids, keys in chunks(n, seed):
            fx.add_with_ids(keys, ids)
        fx.search(queries[:1].numpy(), 10)
        f1 = _timeit(lambda: fx.search(queries[:1].numpy(), 10), 3 if n >= 10**6 else 10)
        fb = _timeit(lambda: fx.search(queries.numpy(), 10), 1)
        f_reps = 5 if n >= 10**6 else (10 if n >= 10**5 else 20)
        f_single = _timeit_each(lambda ids: fx.remove_ids(np.array(ids, dtype=np.int64)),
                                [[int(v)] for v in victims[:f_reps]])
        f_batch = _timeit_each(lambda ids: fx.remove_ids(np.array(ids, dtype=np.int64)), batches[:1])
        del fx
        gc.collect()
        # the simple version: MemoryBank in RAM + atomic npz save per request (O(N) on disk)
        mb_single = mb_batch = None
        if n <= 100_000:
            keys = np.concatenate([k for _, k in chunks(n, seed)])
            v = np.zeros((n, VALUE_DIM), dtype=np.float32)
            bank = MemoryBank(np.arange(n), np.arange(n) % 10, keys, v, {"exp_avg": v, "exp_avg_sq": v.copy()})
            del keys
            path = d / "bank.npz"

            def mb_delete(ids: list[int]) -> None:
                bank.delete(ids)
                bank.save(path)
            mb_single = _median_ms(_timeit_each(mb_delete, [[int(x)] for x in victims[:5]]))
            mb_batch = _median_ms(_timeit_each(mb_delete, batches[:1]))
            del bank
            gc.collect()
        shutil.rmtree(d, ignore_errors=True)
        s_ms, b_ms, fs_ms, fb_ms = _median_ms(single), _median_ms(batch), _median_ms(f_single), _median_ms(f_batch)
        del_rows.append([n, s_ms, float(np.percentile(single, 90) * 1e3), 1e3 * statistics.median(nosync), b_ms, b_ms / 1000, fs_ms, fb_ms,
                         fs_ms / s_ms, "-" if mb_single is None else mb_single, "-" if mb_batch is None else mb_batch,
                         "yes" if tail_zero and gone else "NO", scanned])
        search_rows.append([n, store_search[0], store_search[1], _median_ms(f1), 256 / fb[0]])
    floor = _fsync_floor(workdir)
    base = del_rows[0][1]
    for r in del_rows:
        r.insert(3, r[1] / base)
    return [
        table("Deletion (ms; BankStore = durable, physical, IVF index updated)",
               ["bank rows", "store 1 id median", "store 1 id p90", "vs smallest bank", "store 1 id without the 2 flushes",
                "store 1,000 ids",
                "store per id in batch", "FAISS remove_ids 1 id", "FAISS 1,000 ids", "FAISS / store (1 id)",
                "MemoryBank+npz save 1 id", "MemoryBank+npz 1,000 ids", "tail zeroed, ids unretrievable",
                "file scan: deleted keys absent"], del_rows),
        f"One fdatasync of a 4 KiB write on this disk (the durability floor; a deletion needs two): "
        f"median {floor:.3f} ms.\n",
        table("Exact top-10 search (1 thread)",
               ["bank rows", "store 1 query ms", "store queries/s (batch 256)", "FAISS flat 1 query ms",
                "FAISS queries/s (batch 256)"], search_rows),
        table("IVF approximate search (centroids fitted on 19,744 held-out keys; recall@10 vs exact)",
               ["bank rows", "nlist", "nprobe", "recall@10", "1 query ms", "queries/s (batch 64)", "build s"],
               ann_rows),
    ]


def _fsync_floor(workdir: Path) -> float:
    """Median ms of pwrite(4 KiB) + fdatasync on a scratch file: what any durable write costs here."""
    path = workdir / "fsync.probe"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.pwrite(fd, bytes(1 << 20), 0)
        os.fdatasync(fd)
        ts = _timeit_each(lambda i: (os.pwrite(fd, os.urandom(4096), (i % 256) * 4096), os.fdatasync(fd)), list(range(30)))
    finally:
        os.close(fd)
        path.unlink()
    return _median_ms(ts)


def _timeit_each(fn, args: list) -> list[float]:
    out = []
    for a in args:
        t = time.perf_counter()
        fn(a)
        out.append(time.perf_counter() - t)
    return out


# ---------------------------------------------------------------- inference
def _plain_vit(cfg):
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(img_size=cfg.img_size, patch_size=cfg.patch_size, in_chans=cfg.in_chans,
                             num_classes=cfg.num_classes, embed_dim=cfg.embed_dim, depth=cfg.depth,
                             num_heads=cfg.num_heads, mlp_ratio=cfg.mlp_ratio, class_token=True, global_pool="token")


def bench_inference(quick: bool, seed: int) -> list[str]:
    import torch

    from munkey_core.config import PROFILES
    from munkey_core.model.munkey_vit import MunkeyViT

    torch.manual_seed(seed)
    cfg = PROFILES["cpu"].model
    b = 256
    plain, munkey = _plain_vit(cfg).eval(), MunkeyViT(cfg).eval()
    lates = {L: MunkeyViT(replace(cfg, inject_at=L)).eval() for L in (cfg.depth // 2, cfg.depth - 1)}
    x = torch.randn(b, cfg.in_chans, cfg.img_size, cfg.img_size)
    reps = 3 if quick else 5
    rows = []
    with torch.inference_mode():
        plain(x)
        for k in (1, 4, 8) if quick else (1, 4, 8, 16):
            v = torch.randn(b, k, cfg.exemplar_dim)
            runs = {"plain": [], "munkey": [], "chunked": [], **{f"late{L}": [] for L in lates}}
            step = max(1, b // k)  # ~256 sequences per call: the working set stays in cache
            for _ in range(reps):  # interleaved, so load changes hit all alike
                runs["plain"] += _timeit(lambda: plain(x), 1)
                runs["munkey"] += _timeit(lambda: munkey.forward_multi(x, v), 1)
                runs["chunked"] += _timeit(lambda: [munkey.forward_multi(x[i:i + step], v[i:i + step])
                                                    for i in range(0, b, step)], 1)
                for L, m in lates.items():
                    runs[f"late{L}"] += _timeit(lambda: m.forward_multi(x, v), 1)
            t = {name: statistics.median(ts) for name, ts in runs.items()}
            row = [k, b / t["plain"], b / t["munkey"], t["munkey"] / (k * t["plain"]), b / t["chunked"],
                   t["chunked"] / (k * t["plain"])]
            for L in lates:
                row += [b / t[f"late{L}"], t[f"late{L}"] / (k * t["plain"])]
            rows.append(row)
    header = ["K", "plain ViT img/s", "ensemble, 256 images in one call, img/s", "one call / (K x plain)",
              "ensemble, 256/K images per call, img/s", "chunked / (K x plain)"]
    for L in lates:
        header += [f"late@{L} img/s", f"late@{L} / (K x plain)"]
    return [table(f"Inference (model forwards only, batch {b}, cpu profile: width {cfg.embed_dim}, depth "
                   f"{cfg.depth}, {(cfg.img_size // cfg.patch_size) ** 2} patches; late@L: token joins at block L)",
                   header, rows)]


# ---------------------------------------------------------------- training
def _train_data(n: int, seed: int):
    import numpy as np
    from sklearn.datasets import load_digits

    from munkey_core.training.train import TrainData

    d = load_digits()
    reps = -(-n // len(d.images))
    images = np.tile((d.images * (255 / 16)).astype(np.uint8), (reps, 1, 1))[:n, ..., None]
    labels = np.tile(d.target, reps)[:n].astype(np.int64)
    keys = np.random.default_rng(seed).standard_normal((n, KEY_DIM), dtype=np.float32)
    keys /= np.linalg.norm(keys, axis=1, keepdims=True)
    return TrainData(images, labels, np.arange(n), keys)


def _plain_epochs(model_cfg, cfg, data) -> list[float]:
    """The same loop as train_munkey without the memory: preprocessing, shift, AdamW, cosine."""
    import math

    import numpy as np
    import torch
    import torch.nn.functional as F

    from munkey_core.model.munkey_vit import preprocess_images
    from munkey_core.training.train import cosine_schedule, random_shift

    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    model = _plain_vit(model_cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                            weight_decay=cfg.weight_decay)
    n = len(data.labels)
    steps = math.ceil(n / cfg.batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, cosine_schedule(steps * cfg.epochs, steps))
    images = torch.from_numpy(np.ascontiguousarray(data.images))
    labels = torch.from_numpy(data.labels)
    out = []
    for _ in range(cfg.epochs):
        t = time.perf_counter()
        model.train()
        for idx in torch.randperm(n, generator=gen).split(cfg.batch_size):
            x = random_shift(preprocess_images(images[idx], model_cfg.img_size), cfg.augment_shift, gen)
            loss = F.cross_entropy(model(x), labels[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            loss.item()
        out.append(time.perf_counter() - t)
    return out


def bench_training(quick: bool, seed: int) -> list[str]:
    from munkey_core.config import PROFILES, with_overrides
    from munkey_core.training.train import neighbour_table, train_munkey
    from munkey_core.bank.memory import MemoryBank

    n = 2000 if quick else 4000
    model_cfg = PROFILES["cpu"].model
    cfg = with_overrides(PROFILES["cpu"].train, {"epochs": 2, "seed": seed})
    data = _train_data(n, seed)
    bank = MemoryBank.create(data.ids, data.labels, data.keys, model_cfg.exemplar_dim)
    t = time.perf_counter()
    neighbour_table(bank, cfg.k_train, cfg.tau)
    table_s = time.perf_counter() - t
    plain, munkey = [], []
    for _ in range(1 if quick else 2):  # alternate, drop each run's first (warm-up) epoch
        plain += _plain_epochs(model_cfg, cfg, data)[1:]
        munkey += [h["seconds"] for h in train_munkey(model_cfg, cfg, data, progress=False).history][1:]
    p, m = statistics.median(plain), statistics.median(munkey)
    rows = [[n, p, m, m / p, table_s, n / p, n / m]]
    return [table("Training (cpu profile, batch 128, seconds per epoch, median of alternated runs)",
                   ["train images", "plain ViT s/epoch", "MUNKEY s/epoch", "MUNKEY / plain",
                    "one-off K' neighbour table s", "plain img/s", "MUNKEY img/s"], rows)]


# ---------------------------------------------------------------- memory
def _peak_rss_mib() -> float:
    """This process's peak RSS (VmHWM; ru_maxrss would carry the parent's peak across exec on Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _child_train_rss(n: int) -> float:
    import torch

    from munkey_core.config import PROFILES, with_overrides
    from munkey_core.training.train import train_munkey

    torch.set_num_threads(1)
    cfg = with_overrides(PROFILES["cpu"].train, {"epochs": 1})
    train_munkey(PROFILES["cpu"].model, cfg, _train_data(n, 0), progress=False)
    return _peak_rss_mib()


def _child_serve_rss(n: int, workdir: str) -> float:
    import torch

    from munkey_core.config import PROFILES
    from munkey_core.model.munkey_vit import MunkeyViT, preprocess_images
    from munkey_core.model.predict import predict

    torch.set_num_threads(1)
    data = _train_data(n, 0)
    model = MunkeyViT(PROFILES["cpu"].model).eval()
    store = _build_store(Path(workdir) / "serve.store", n, 0)
    bank = store.to_bank()  # predict() takes a MemoryBank; serving keeps keys+exemplars (no moments)
    bank.moments = {}
    store.close()
    x = preprocess_images(torch.from_numpy(data.images[:1024]), 28)
    predict(model, bank, x, bank.keys[:1024], k=8, tau=0.05)
    return _peak_rss_mib()


def bench_memory(workdir: Path) -> list[str]:
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    from munkey_core.bank.store import BankStore

    rows = []
    for dtype in ("float32", "float16"):
        s = BankStore.create(workdir / f"m_{dtype}.store", capacity=1, key_dim=KEY_DIM, value_dim=VALUE_DIM,
                             moment_names=["exp_avg", "exp_avg_sq"], dtype=dtype)
        item = 4 if dtype == "float32" else 2
        serve = 16 + item * (KEY_DIM + VALUE_DIM)
        exemplar = item * VALUE_DIM
        rows.append([dtype, s.row_bytes, serve, exemplar, 50_000 * s.row_bytes / 2**20, 50_000 * serve / 2**20,
                     50_000 * exemplar / 2**20, 10**6 * s.row_bytes / 2**30])
        s.close()
    rss = []
    ctx = mp.get_context("spawn")
    for what, fn, args in [("training, 4,000 images, cpu profile", _child_train_rss, (4000,)),
                           ("serving, 100,000-row bank, 1,024 queries, K=8", _child_serve_rss,
                            (100_000, str(workdir)))]:
        with ProcessPoolExecutor(1, mp_context=ctx) as ex:
            rss.append([what, ex.submit(fn, *args).result()])
    return [
        table("Bytes per stored sample (1280-d key, 128-d exemplar; training adds two AdamW moment rows)",
               ["dtype", "training row B", "serving row B (id, label, key, exemplar)", "exemplar only B",
                "CIFAR-10 50k training MiB", "CIFAR-10 50k serving MiB", "CIFAR-10 50k exemplars MiB",
                "1M training GiB"], rows),
        table("Peak RSS (separate processes, 1 thread)", ["process", "peak RSS MiB"], rss),
    ]


# ---------------------------------------------------------------- entry point
def run(args: argparse.Namespace) -> int:
    import torch

    from munkey_core.errors import MunkeyError

    torch.set_num_threads(1)
    sizes = [int(s) for s in str(args.sizes).split(",") if s.strip()]
    if args.quick and args.sizes == "10000,100000,1000000":
        sizes = [10_000, 100_000]
    if any(s < 5000 for s in sizes):
        raise MunkeyError("--sizes must each be at least 5000 (a 1,000-id batch is deleted three times).")
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = set(sections) - {"deletion", "forget", "search", "inference", "training", "memory"}
    if unknown:
        raise MunkeyError(f"Unknown --sections {sorted(unknown)}; choose from deletion, forget, search, inference, "
                          "training, memory.")
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="munkey-perf-"))
    workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    out: list[str] = []
    try:
        for name in sections:
            print(f"[perf] {name} ...", flush=True)
            if name == "deletion":
                tables = bench_deletion(sizes, args.quick, args.seed, workdir)
            elif name == "forget":
                from munkey_core.bench.forget_storage import bench_forget

                tables = bench_forget(sizes, args.quick, args.seed, workdir,
                                      legacy_max=getattr(args, "legacy_max", 100_000))
            elif name == "search":
                from munkey_core.bench.search import run_table, scale_table

                tables = [scale_table(sizes, args.seed)]
                if getattr(args, "run", None):
                    tables.append(run_table(args.run, [4, 8, 16]))
            elif name == "inference":
                tables = bench_inference(args.quick, args.seed)
            elif name == "training":
                tables = bench_training(args.quick, args.seed)
            else:
                tables = bench_memory(workdir)
            for t in tables:
                print(t, flush=True)
            out += tables
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    minutes = (time.perf_counter() - t0) / 60
    footer = (f"Machine: {os.cpu_count()} CPU cores, {platform.machine()}, torch {torch.__version__}, "
              f"1 thread per process; total {minutes:.1f} min.\n")
    print(footer)
    if args.out:
        Path(args.out).write_text("\n".join(out) + "\n" + footer)
    return 0
