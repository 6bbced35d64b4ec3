"""`munkey bench search`: the product's top-K search, exact vs IVF, on a run's own keys and at scale.

- On a run (`munkey bench search RUN`): the run's bank searched with its validation keys (what the
  IVF centroids are fitted on) and its test keys (which they never saw): recall@10 of IVF against
  exact at several nprobe, the time per query of each and the index's build time. This is what a
  user of that run gets with `--search ivf` (or `auto` above the threshold).
- At scale (`--rows 1000000`, also `munkey bench perf --sections search`): a bank of synthetic
  clustered unit keys of the default encoder's size (1280-d float32) with 128-d exemplars, searched
  through the product's path (bank/search.py `BankSearch`, exact and IVF in the same run): one
  query's search, one image's whole `predict` (cpu-profile model, K = 8), recall@10 on held-out
  queries, the index build, and 1,000 deletions followed by the index (never retrieved after).
  Synthetic clusters are well separated, so their recall is optimistic; real keys: the run table.
Memory at 1M rows: about 6 GiB (keys 5.1 GB, exemplars 0.5 GB, the id map, the index's 12 B per row).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from pathlib import Path

from munkey_core.bench._common import KEY_DIM, VALUE_DIM, chunks, table

HELP = "exact vs IVF top-K search: recall on a run's own keys, speed at 1M rows"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", nargs="?", default=None, help="a MUNKEY run directory: recall and speed on its own keys")
    p.add_argument("--nprobe", default="2,4,8,16", help="IVF lists probed per query (comma list)")
    p.add_argument("--rows", default="", help="also time banks of these sizes of synthetic keys, e.g. 1000000")
    p.add_argument("--out", default=None, help="also write the tables (markdown) to this file")
    p.add_argument("--seed", type=int, default=0)


def _median_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def run_table(path: str | Path, nprobes: list[int], k: int = 10) -> str:
    """Recall@k of IVF vs exact and ms per query on a run's own bank, validation and test keys."""
    import numpy as np
    import torch

    from munkey_core.bank.search import recall_at_k
    from munkey_core.run.loaded import LoadedMunkeyRun

    torch.set_num_threads(1)
    run = LoadedMunkeyRun(path, device="cpu", search="ivf")
    val, test = run.split_keys("val"), run.split_keys("test")
    t = time.perf_counter()
    index = run.searcher.ivf()
    build = time.perf_counter() - t
    some = test[:50]
    exact_ms = _median_ms(lambda: [run.bank.search(q[None], k) for q in some], 3) / len(some)
    rows = []
    for nprobe in nprobes:
        ivf_ms = _median_ms(lambda: [index.search(q[None], k, nprobe=nprobe) for q in some], 3) / len(some)
        best = torch.topk(torch.from_numpy(test[:200]) @ index.centroids.T, min(nprobe, index.nlist)).indices
        probed = float(np.mean([sum(len(index.list_rows(int(c))) for c in lists) for lists in best]))
        rows.append([nprobe, recall_at_k(index, run.bank, val, k, nprobe),
                     recall_at_k(index, run.bank, test, k, nprobe), probed / len(run.bank), exact_ms, ivf_ms,
                     exact_ms / ivf_ms, "yes" if nprobe == index.nprobe else ""])
    title = (f"Search on {Path(path).name} ({run.config['dataset']}, {len(run.bank):,} bank rows, "
             f"{run.config['encoder']['name']} keys {run.bank.key_dim}-d; {index.nlist} lists fitted on "
             f"{len(val):,} validation keys in {build:.2f} s; recall@{k} of IVF vs exact)")
    return table(title, ["nprobe", f"recall@{k} validation keys", f"recall@{k} test keys", "share of bank read",
                         "exact ms/query", "IVF ms/query", "exact / IVF", "default"], rows)


def scale_table(sizes: list[int], seed: int = 0, nprobe: int | None = None, k: int = 10) -> str:
    """The product's search path (BankSearch, exact and IVF) on banks of synthetic keys."""
    import numpy as np
    import torch

    from munkey_core.bank.memory import MemoryBank
    from munkey_core.bank.search import BankSearch, recall_at_k
    from munkey_core.config import PROFILES, SearchConfig
    from munkey_core.model.munkey_vit import MunkeyViT
    from munkey_core.model.predict import predict

    torch.set_num_threads(1)
    held_out = np.concatenate([h for _, h in chunks(20_000, seed, start_id=10**9)])  # never in a bank
    queries, fit_keys = held_out[:256], held_out[256:]
    model_cfg = PROFILES["cpu"].model
    model = MunkeyViT(model_cfg).eval()
    image = torch.rand(1, model_cfg.in_chans, model_cfg.img_size, model_cfg.img_size)
    out = []
    for n in sizes:
        print(f"[search] bank of {n:,} synthetic rows ...", flush=True)
        keys = np.empty((n, KEY_DIM), dtype=np.float32)
        for ids, block in chunks(n, seed):
            keys[ids[0]:ids[0] + len(ids)] = block
        values = np.empty((n, VALUE_DIM), dtype=np.float32)
        for lo in range(0, n, 100_000):  # in blocks: no full-size temporaries
            block = np.random.default_rng([seed, lo]).standard_normal((min(100_000, n - lo), VALUE_DIM),
                                                                       dtype=np.float32)
            values[lo:lo + len(block)] = block * np.float32(0.02)
        bank = MemoryBank(np.arange(n), np.arange(n) % 10, keys, values)
        del keys, values
        cfg = SearchConfig(mode="ivf", **({"nprobe": nprobe} if nprobe else {}))
        exact, ivf = BankSearch(bank, SearchConfig(mode="exact")), BankSearch(bank, cfg, lambda: fit_keys)
        t = time.perf_counter()
        index = ivf.ivf()  # centroids, one assignment pass, nprobe calibration
        build = time.perf_counter() - t
        n_exact = 3 if n >= 10**6 else 10
        times: dict[str, list[float]] = {"exact": [], "ivf": [], "p_exact": [], "p_ivf": []}
        for rnd in range(2):  # two rounds of blocks (exact, IVF, predict both): load changes hit all alike
            for q in queries[rnd * n_exact:(rnd + 1) * n_exact]:
                times["exact"].append(_median_ms(lambda: exact.search(q[None], k), 1))
            for q in queries[rnd * 50:(rnd + 1) * 50]:
                times["ivf"].append(_median_ms(lambda: ivf.search(q[None], k), 1))
            for q in queries[rnd * n_exact:(rnd + 1) * n_exact]:
                times["p_exact"].append(_median_ms(lambda: predict(model, bank, image, q[None], k=8, tau=0.05,
                                                                   searcher=exact), 1))
                times["p_ivf"].append(_median_ms(lambda: predict(model, bank, image, q[None], k=8, tau=0.05,
                                                                 searcher=ivf), 1))
        e, i, pe, pi = (statistics.median(times[name]) for name in ("exact", "ivf", "p_exact", "p_ivf"))
        recall = recall_at_k(index, bank, queries, k)
        # 1,000 deletions: bank rows swapped, the index follows (O(1) per id); none is retrieved after
        victims = np.random.default_rng(seed + 1).choice(n, 1000, replace=False)
        hit = bank.ids[ivf.search(queries[:32], 50)[1].numpy()].ravel()
        victims = np.array(list(dict.fromkeys(hit[:200].tolist() + victims.tolist()))[:1000])  # retrieved ids first
        t = time.perf_counter()
        bank.delete(victims.tolist())
        del_ms = 1e3 * (time.perf_counter() - t) / len(victims)
        gone = not set(victims.tolist()) & set(bank.ids[ivf.search(queries[:32], 50)[1].numpy()].ravel().tolist())
        out.append([n, index.nlist, min(index.nprobe, index.nlist), e, i, e / i, pe, pi, pe / pi, recall, build, del_ms,
                    "yes" if gone else "NO"])
        del bank, exact, ivf, index
        gc.collect()  # the bank and its index refer to each other: free both before the next size
    return table(f"The product's search at scale (synthetic clustered {KEY_DIM}-d float32 keys, optimistic for "
                 f"recall; centroids on {len(fit_keys):,} held-out keys; nprobe calibrated on them; 1 thread; "
                 f"top-{k}; median ms per query of 2 x 50 IVF queries, 2 x 10 exact ones, 2 x 3 from 1M rows)",
                 ["bank rows", "nlist", "nprobe", "exact ms/query", "IVF ms/query", "exact / IVF",
                  "predict 1 image, exact ms", "predict 1 image, IVF ms", "predict exact / IVF",
                  f"recall@{k} (256 held-out queries)", "IVF build s", "delete ms/id (bank + index)",
                  "deleted never retrieved"], out)


def run(args: argparse.Namespace) -> int:
    from munkey_core.errors import MunkeyError

    try:
        nprobes = [int(x) for x in str(args.nprobe).split(",") if x.strip()]
        sizes = [int(x) for x in str(args.rows).split(",") if x.strip()]
    except ValueError:
        raise MunkeyError("--nprobe and --rows take comma lists of whole numbers, e.g. --nprobe 4,8,16.") from None
    if not nprobes or min(nprobes) < 1:
        raise MunkeyError("--nprobe needs at least one value of 1 or more.")
    if not args.run and not sizes:
        raise MunkeyError("Name a run directory (recall on its own keys) and/or --rows 1000000 (speed at scale).")
    if any(s < 2000 for s in sizes):
        raise MunkeyError("--rows must each be at least 2000.")
    tables = []
    if args.run:
        tables.append(run_table(args.run, nprobes))
        print(tables[-1], flush=True)
    if sizes:
        tables.append(scale_table(sizes, args.seed))
        print(tables[-1], flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(tables))
    return 0
