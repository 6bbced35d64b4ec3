"""`munkey bench fidelity` smoke test on digits (tiny profile, 3 epochs): every method measured against
its oracle, tables written, and a re-run resumes from the cache without training anything."""

from __future__ import annotations

import csv
import itertools
import json
from pathlib import Path

import pytest

from munkey_core.bench.fidelity_run import FLOOR, MUNKEY_NONE, VIT_NONE
from munkey_core.cli import main
from munkey_core.data import datasets as data_mod
from munkey_core.eval.oracles import oracle_path
from munkey_core.unlearn.tuning import settings_text
from munkey_core.run.rows import bank_ids
from munkey_core.service import MunkeyRun
from munkey_core.data.sampling import random_ids

GAPS = ("TA", "RA", "FA", "MIA")


def _gap(row: dict, oracle: dict) -> float:
    """Avg Gap recomputed from the CSV's own columns."""
    return sum(abs(float(row[k]) - float(oracle[k])) for k in GAPS) / 4


def _pooled_by_enumeration(models: list[dict]) -> tuple[float, float, float]:
    """(row-vs-retrains Avg Gap, retrains among themselves, relabelling p) of models[0] against the three
    retrains models[1:], each of the four models labelled "the row" in turn."""
    gap = [[_gap(a, b) for b in models] for a in models]

    def excess(j: int) -> float:
        rest = [i for i in range(4) if i != j]
        return sum(gap[j][i] for i in rest) / 3 - sum(gap[a][b] for a, b in itertools.combinations(rest, 2)) / 3

    p = sum(excess(j) >= excess(0) - 1e-9 for j in range(4)) / 4
    return sum(gap[0][1:]) / 3, (gap[1][2] + gap[1][3] + gap[2][3]) / 3, p


def test_bench_fidelity_noise_floor_and_controls_come_from_distinct_models(cache_dir: Path, tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture) -> None:
    argv = ["bench", "fidelity", "--dataset", "digits", "--profile", "tiny", "--seeds", "1", "--rates", "0.1",
            "--epochs", "3", "--mia", "strong", "--methods", "neggrad+", "--work", str(tmp_path / "work"),
            "--out", str(tmp_path / "out"), "--floor-oracles", "2"]
    assert main(argv) == 0
    capsys.readouterr()
    rows = list(csv.DictReader(open(tmp_path / "out" / "fidelity_digits.csv")))
    by = {}
    for r in rows:
        by.setdefault(r["method"], []).append(r)
    m_star, t_star = by["Retrain (M-oracle)"][0], by["Retrain (T-oracle)"][0]
    seed_dir = tmp_path / "work" / "digits_tiny" / "seed_0"
    mrun = MunkeyRun(seed_dir / "munkey", device="cpu")
    ds = data_mod.load_dataset("digits", seed=0)
    ids = random_ids(ds.train.ids, 0.1, 0)
    # noise floor: two more oracles per family, other training seeds, the same split and retain set
    assert [r["train_seed"] for r in by[FLOOR["M"]]] == ["1000", "2000"] == [r["train_seed"] for r in by[FLOOR["T"]]]
    main_oracle = oracle_path(mrun.paths.root, ids, "munkey")
    weights = {(main_oracle / "model.pt").read_bytes()}
    for r in by[FLOOR["M"]]:
        twin = oracle_path(mrun.paths.root, ids, "munkey", int(r["train_seed"]))
        cfg = json.loads((twin / "config.json").read_text())
        assert cfg["train"]["seed"] == int(r["train_seed"]) and cfg["train"]["split_seed"] == 0
        assert sorted(bank_ids(twin)) == sorted(bank_ids(main_oracle)) == sorted(set(ds.train.ids) - set(ids))
        weights.add((twin / "model.pt").read_bytes())
        assert float(r["AvgGap"]) == pytest.approx(_gap(r, m_star))
    assert len(weights) == 3  # three distinct models
    for r in by[FLOOR["T"]]:
        assert float(r["AvgGap"]) == pytest.approx(_gap(r, t_star))
    # positive controls: the undeleted models, against the same oracles; MUNKEY's FA from the full bank
    none = by[MUNKEY_NONE][0]
    assert float(none["FA"]) == pytest.approx(mrun.accuracy_on_ids(ids))
    assert float(none["AvgGap"]) == pytest.approx(_gap(none, m_star)) and none["oracle"] == "M"
    assert float(by[VIT_NONE][0]["AvgGap"]) == pytest.approx(_gap(by[VIT_NONE][0], t_star))
    # the strong attack's references: MUNKEY runs for the MUNKEY rows, plain ViTs for the ViT rows, none of
    # them trained on a forget sample (forget and test samples scored against the same references)
    for family in ("munkey", "vit"):
        (folder,) = seed_dir.glob(f"refs_{family}_*")
        refs = sorted(folder.glob("ref_*"))
        assert len(refs) == 2
        for ref in refs:
            cfg = json.loads((ref / "config.json").read_text())
            assert cfg.get("kind", "munkey") == ("munkey" if family == "munkey" else "classifier")
            assert ("encoder" in cfg) == (family == "munkey")
        info = json.loads((folder / "references.json").read_text())
        assert info["family"] == family and not set(ids) & {i for h in info["halves"] for i in h}
    assert not set(ids) & set(bank_ids(sorted(seed_dir.glob("refs_munkey_*"))[0] / "ref_0"))
    md = (tmp_path / "out" / "fidelity_digits.md").read_text()
    floor = (float(by[FLOOR["M"]][0]["AvgGap"]) + float(by[FLOOR["M"]][1]["AvgGap"])) / 2
    line = next(x for x in md.splitlines() if x.startswith("| MUNKEY (key deletion) |"))
    assert f"{floor:.2f}" in line.split("|")[10]  # the noise floor column beside the Avg Gap
    # every retrain pooled (the M-oracle and both floor oracles alike), its relabelling p enumerated here
    models = [by["MUNKEY (key deletion)"][0], m_star, *by[FLOOR["M"]]]
    gap, among, p = _pooled_by_enumeration(models)
    pooled = next(x for x in md.splitlines() if x.startswith("MUNKEY (key deletion) against every retrain"))
    assert f"Avg Gap {gap:.2f}, the retrains among themselves {among:.2f}" in pooled
    assert f"p = {p:.2f} over 4 relabellings" in pooled
    fa_offset = float(models[0]["FA"]) - sum(float(m["FA"]) for m in models[1:]) / 3
    assert f"FA {fa_offset:+.2f}, MIA" in pooled
    # the plain-ViT rows the same way, against the T-oracle and its floor oracles (not the M family's)
    for row in (by["neggrad+"][0], by[VIT_NONE][0]):
        vit_models = [row, t_star, *by[FLOOR["T"]]]
        gap, among, p = _pooled_by_enumeration(vit_models)
        offsets = " / ".join(f"{float(row[k]) - sum(float(m[k]) for m in vit_models[1:]) / 3:+.2f}" for k in GAPS)
        assert (f"| {row['method']} | 1 | {gap:.2f} | {among:.2f} | {gap - among:+.2f} | {p:.3f} (0.250) | "
                f"{offsets} |") in md.splitlines()
    assert any(x.startswith(MUNKEY_NONE + " against every retrain") for x in md.splitlines())


def test_bench_fidelity_runs_and_resumes(cache_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    argv = ["bench", "fidelity", "--dataset", "digits", "--profile", "tiny", "--seeds", "1", "--rates", "0.1",
            "--epochs", "3", "--mia", "strong", "--methods", "neggrad+,ssd", "--work", str(tmp_path / "work"),
            "--out", str(tmp_path / "out"), "--select", "--max-ps", "10"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    # MUNKEY, ViT, M-oracle and T-oracle, one noise-floor oracle of each, 2 MUNKEY and 2 ViT references,
    # the selection's M-oracle
    assert "trained 11 model(s)" in first
    rows = list(csv.DictReader(open(tmp_path / "out" / "fidelity_digits.csv")))
    methods = [r["method"] for r in rows]
    assert methods == ["Retrain (M-oracle)", FLOOR["M"], MUNKEY_NONE, "MUNKEY (key deletion)", "Retrain (T-oracle)",
                       FLOOR["T"], VIT_NONE, "neggrad+", "ssd", "MUNKEY (selected checkpoint)"]
    by = {r["method"]: r for r in rows}
    assert float(by["Retrain (M-oracle)"]["AvgGap"]) == 0.0 and by["MUNKEY (key deletion)"]["oracle"] == "M"
    assert by["ssd"]["oracle"] == "T" and float(by["ssd"]["seconds"]) > 0
    # the selected checkpoint: one of the three epochs, measured against the same M-oracle
    sel = json.loads((tmp_path / "work" / "digits_tiny" / "seed_0" / "selection.json").read_text())["selection"]
    chosen = by["MUNKEY (selected checkpoint)"]
    assert chosen["oracle"] == "M" and int(chosen["epoch"]) in (1, 2, 3)
    assert sel["selected"] == f"epoch_{int(chosen['epoch']):03d}.pt" and len(sel["scores"]) == 3
    # its Avg Gap is the mean |metric - M-oracle's| over TA, RA, FA, MIA, recomputed here from the rows
    m_star = by["Retrain (M-oracle)"]
    gap = sum(abs(float(chosen[k]) - float(m_star[k])) for k in ("TA", "RA", "FA", "MIA")) / 4
    assert float(chosen["AvgGap"]) == pytest.approx(gap, abs=1e-9)
    # the final epoch is the run itself: the same measurements as the plain row, and only the final epoch is
    assert (chosen["epoch"] == "3") == (chosen["AvgGap"] == by["MUNKEY (key deletion)"]["AvgGap"])
    assert all("RMIA" in r["MIA_attack"] for r in rows)
    assert all(0 <= float(r["TPR@0.1%"]) <= float(r["TPR@1%"]) <= 100 for r in rows)
    seed_dir = tmp_path / "work" / "digits_tiny" / "seed_0"
    oracles = sorted(p.name for p in (seed_dir / "munkey" / "oracles").iterdir())
    # the M-oracle, its noise-floor twin (training seed 1000) and the selection's M-oracle
    assert len(oracles) == 3 and all(o.startswith("random_") for o in oracles)
    assert sum(o.endswith("_munkey_t1000") for o in oracles) == 1
    md = (tmp_path / "out" / "fidelity_digits.md").read_text()
    assert "| MUNKEY (key deletion) | M |" in md and "forget 10%" in md and "Selected checkpoints" in md
    assert "noise floor" in md and "against a noise floor of" in md
    # the audited request ran on a copy: the cached run is as trained, the copy is gone
    audited = json.loads((tmp_path / "work" / "digits_tiny" / "seed_0" / "rate_0.1_audited.json").read_text())
    config = tmp_path / "work" / "digits_tiny" / "seed_0" / "munkey" / "config.json"
    n_train = json.loads(config.read_text())["train_size"]
    assert audited["deleted"] == round(0.1 * n_train) and audited["bank_size"] == n_train - audited["deleted"]
    assert audited["request_seconds"] >= audited["deletion_seconds"] > 0
    assert not (tmp_path / "work" / "digits_tiny" / "seed_0" / "munkey" / "forgotten.json").exists()
    assert not (tmp_path / "work" / "digits_tiny" / "seed_0" / "_audited_copy").exists()
    assert "audited, durable" in md
    # resume: the cached cell; then, with the cell's rows removed, the cached models (nothing trained)
    assert main(argv) == 0
    assert "trained 0 model(s)" in capsys.readouterr().out
    (tmp_path / "work" / "digits_tiny" / "seed_0" / "rate_0.1.json").unlink()
    assert main(argv) == 0
    assert "trained 0 model(s)" in capsys.readouterr().out
    again = list(csv.DictReader(open(tmp_path / "out" / "fidelity_digits.csv")))
    drop_time = lambda rs: [{k: v for k, v in r.items() if k != "seconds"} for r in rs]  # noqa: E731
    assert drop_time(again) == drop_time(rows)  # the same measurements from the cached models


def test_bench_fidelity_rejects_bad_options(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["bench", "fidelity", "--rates", "10", "--work", str(tmp_path)]) == 2
    assert "--rates" in capsys.readouterr().err
    assert main(["bench", "fidelity", "--methods", "retrain", "--work", str(tmp_path)]) == 2
    assert "Unknown method" in capsys.readouterr().err
    # refused before the first model is trained (an hour at the cpu profile), not after it
    for argv, said in ((["--mia", "strong", "--mia-refs", "3"], "--mia-refs must be an even number"),
                       (["--epochs", "0"], "epochs (--epochs) must be"), (["--vit-shift", "1.5"], "--vit-shift is"),
                       (["--munkey-set", "per_sample_clip=x"], "--munkey-set per_sample_clip must be a number"),
                       (["--munkey-set", "per_sample_clip=-1"], "per_sample_clip"),
                       (["--munkey-set", "seed=3"], "--munkey-set takes NAME=VALUE")):
        assert main(["bench", "fidelity", "--profile", "tiny", *argv, "--work", str(tmp_path / "w")]) == 2
        assert said in capsys.readouterr().err, argv
    assert not (tmp_path / "w").exists()


def test_bench_fidelity_munkey_set_trains_runs_and_oracles_with_it_in_their_own_folder(
        cache_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """--munkey-set changes the MUNKEY recipe of the run and, through its config, of its M-oracle; the models
    live in their own --work subfolder (never the profile recipe's) and the table names the setting. A cached
    run whose recipe is no longer the profile's is refused, not measured as today's."""
    argv = ["bench", "fidelity", "--dataset", "digits", "--profile", "tiny", "--seed-list", "0", "--rates", "0.1",
            "--epochs", "2", "--methods", "", "--floor-oracles", "0", "--munkey-set", "per_sample_clip=0.5",
            "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    assert "trained 2 model(s)" in capsys.readouterr().out
    assert [p.name for p in (tmp_path / "work").iterdir()] == ["digits_tiny_per_sample_clip0.5"]
    root = tmp_path / "work" / "digits_tiny_per_sample_clip0.5" / "seed_0" / "munkey"
    (oracle,) = (root / "oracles").iterdir()
    for model in (root, oracle):
        assert json.loads((model / "config.json").read_text())["train"]["per_sample_clip"] == 0.5, model
    assert "MUNKEY per_sample_clip 0.5 (--munkey-set" in (tmp_path / "out" / "fidelity_digits.md").read_text()
    import dataclasses

    from munkey_core.config import PROFILES

    changed = dataclasses.replace(PROFILES["tiny"], dataset_recipe={"digits": {"absent_skip_hardest": 0.2}})
    monkeypatch.setitem(PROFILES, "tiny", changed)  # the profile's digits recipe moves after the run was cached
    assert main(argv) == 2
    said = capsys.readouterr().err
    assert "was trained with" in said and "absent_skip_hardest" in said and "Traceback" not in said
    assert [p.name for p in (root / "oracles").iterdir()] == [oracle.name]  # nothing trained


def test_bench_fidelity_tune_prints_the_chosen_settings(cache_dir: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture) -> None:
    argv = ["bench", "fidelity", "--dataset", "digits", "--profile", "tiny", "--seeds", "1", "--rates", "0.1",
            "--epochs", "3", "--methods", "ssd", "--floor-oracles", "0", "--tune", "--work", str(tmp_path / "work"),
            "--out", str(tmp_path / "out"), "--vit-shift", "0"]
    assert main(argv) == 0
    assert "trained 5 model(s)" in capsys.readouterr().out  # MUNKEY, ViT, M- and T-oracle, the split's T-oracle
    # --vit-shift: the ViT family trains without augmentation, MUNKEY keeps the profile's
    seed_dir = tmp_path / "work" / "digits_tiny" / "seed_0"
    shift = lambda p: json.loads((p / "config.json").read_text())["train"]["augment_shift"]  # noqa: E731
    assert shift(seed_dir / "munkey") == 0.1 and shift(seed_dir / "vit") == 0.0
    assert [shift(p) for p in sorted((seed_dir / "vit" / "oracles").iterdir())] == [0.0, 0.0]
    rows = {r["method"]: r for r in csv.DictReader(open(tmp_path / "out" / "fidelity_digits.csv"))}
    tuning = json.loads((tmp_path / "work" / "digits_tiny" / "seed_0" / "rate_0.1_tuning.json").read_text())["tuning"]
    grid = tuning["methods"]["ssd"]["grid"]
    best = min(range(len(grid)), key=lambda i: sum(abs(grid[i][k] - tuning["oracle"][k]) for k in GAPS))
    tuned, fixed = rows["ssd (tuned)"], rows["ssd"]
    assert tuned["settings"] == settings_text({k: grid[best]["settings"][k] for k in ("alpha", "lam")})
    assert fixed["settings"] == "alpha=5 lam=1"
    assert float(tuned["val_AvgGap"]) == pytest.approx(grid[best]["AvgGap"])
    assert tuned["oracle"] == "T" and float(tuned["AvgGap"]) == pytest.approx(_gap(tuned, rows["Retrain (T-oracle)"]))
    md = (tmp_path / "out" / "fidelity_digits.md").read_text()
    assert "| ssd (tuned) | T |" in md
    line = next(x for x in md.splitlines() if x.startswith("- ssd:"))
    assert "fixed settings alpha=5 lam=1" in line and f"seed 0: {tuned['settings']} (validation Avg Gap" in line
    assert main(argv) == 0 and "trained 0 model(s)" in capsys.readouterr().out  # resumes from the cache


def _table_lines(md: str) -> list[str]:
    """The table's lines, without those that name the invocation (its wall time, command, merged CSVs)."""
    return [x for x in md.splitlines() if x and not x.startswith(("MIA attack:", "Command:", "Merged:"))]


@pytest.mark.timeout(1800)  # six tiny models on a shared machine
def test_bench_fidelity_merge_csv_equals_one_invocation_over_the_seeds(cache_dir: Path, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture) -> None:
    """Two single-seed invocations merged with --merge-csv give the table (and CSV) of one invocation over
    both seeds; a stored CSV plus a measured seed gives it too; what cannot share a table is refused.
    MUNKEY rows only (the post-hoc rows merge the same way: the committed table test below)."""
    import statistics

    base = ["bench", "fidelity", "--dataset", "digits", "--profile", "tiny", "--rates", "0.1", "--epochs", "2",
            "--methods", "", "--floor-oracles", "1", "--work", str(tmp_path / "work")]
    assert main(base + ["--seeds", "2", "--out", str(tmp_path / "both")]) == 0
    assert main(base + ["--seed-list", "0", "--out", str(tmp_path / "s0")]) == 0
    assert main(base + ["--seed-list", "1", "--out", str(tmp_path / "s1")]) == 0
    csv0, csv1 = str(tmp_path / "s0" / "fidelity_digits.csv"), str(tmp_path / "s1" / "fidelity_digits.csv")
    assert main(base + ["--seeds", "0", "--merge-csv", csv0, csv1, "--out", str(tmp_path / "merged")]) == 0
    assert "trained 0 model(s)" in capsys.readouterr().out
    both = (tmp_path / "both" / "fidelity_digits.md").read_text()
    merged_md = (tmp_path / "merged" / "fidelity_digits.md").read_text()
    assert _table_lines(merged_md) == _table_lines(both)
    assert "2 seed(s) (0, 1)" in merged_md and "Merged: the rows of seed(s) 0, 1 are read from" in merged_md
    # the CSV too, byte for byte: the rows read back are the numbers written (audited requests included)
    assert (tmp_path / "merged" / "fidelity_digits.csv").read_text() == (tmp_path / "both" / "fidelity_digits.csv").read_text()
    # the MUNKEY cell is the mean ± sample sd of the two seeds' Avg Gaps, computed here from the per-seed CSVs
    gaps = [float(next(r for r in csv.DictReader(open(c)) if r["method"] == "MUNKEY (key deletion)")["AvgGap"])
            for c in (csv0, csv1)]
    line = next(x for x in merged_md.splitlines() if x.startswith("| MUNKEY (key deletion) |"))
    assert line.split("|")[9].strip() == f"{statistics.mean(gaps):.2f} ± {statistics.stdev(gaps):.2f}"
    # a stored CSV of seed 0 written before the audited columns, plus seed 1 measured here: the same table,
    # the audited line saying which seeds it covers
    old = tmp_path / "old.csv"
    with open(csv0, newline="") as fh, open(old, "w", newline="") as out:
        reader = csv.DictReader(fh)
        keep = [c for c in reader.fieldnames if not c.startswith("audited_")]
        w = csv.DictWriter(out, fieldnames=keep, extrasaction="ignore")
        w.writeheader()
        w.writerows(reader)
    assert main(base + ["--seed-list", "1", "--merge-csv", str(old), "--out", str(tmp_path / "plus1")]) == 0
    plus1 = (tmp_path / "plus1" / "fidelity_digits.md").read_text()
    differ = [(a, b) for a, b in zip(_table_lines(plus1), _table_lines(both)) if a != b]
    assert len(differ) == 1 and "audited, durable" in differ[0][0] and "(seeds 1 only: the CSV of seed(s) 0" in differ[0][0]
    capsys.readouterr()
    # refused: a seed both read and asked for; cells with other rows (here: a noise-floor row missing)
    assert main(base + ["--seed-list", "0,1", "--merge-csv", csv0, "--out", str(tmp_path / "x")]) == 2
    assert "both in the CSV" in capsys.readouterr().err
    short = tmp_path / "short.csv"
    lines = open(csv1).read().splitlines(keepends=True)
    short.write_text("".join(x for x in lines if "Noise floor: M-oracle" not in x))
    assert short.read_text() != open(csv1).read()
    assert main(base + ["--seeds", "0", "--merge-csv", csv0, str(short), "--out", str(tmp_path / "x")]) == 2
    assert "hold different rows" in capsys.readouterr().err
    assert main(base + ["--seeds", "0", "--out", str(tmp_path / "x")]) == 2  # --seeds 0 only with --merge-csv


TUNED = ("--vit-shift", "0", "--tune")
MUNKEY_ONLY = ("--methods=",)


@pytest.mark.parametrize(("dataset", "folder", "rates", "options"), [
    ("digits", "tuned_strong", "0.1,0.02", TUNED),
    ("digits", "tuned_strong/skip015", "0.1,0.02", MUNKEY_ONLY),
    ("elpv", "tuned_strong", "0.1", TUNED),
    ("elpv", "tuned_strong/elpv_2pct", "0.02", TUNED),
    ("fashion-mnist", "tuned_strong/fashion80", "0.1", TUNED),
    ("fashion-mnist", "tuned_strong/fashion80_2pct", "0.02", TUNED),
])
def test_bench_fidelity_committed_tuned_table_is_what_its_csv_renders(dataset: str, folder: str, rates: str,
                                                                      options: tuple[str, ...], tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture) -> None:
    """Each committed strong-attack table, rendered again from its own CSV by --merge-csv alone
    (--seeds 0: nothing trained or measured): the same table, post-hoc rows and tuned settings included
    where it has them (the MUNKEY-only tables: MUNKEY's rows)."""
    folder_path = Path(__file__).resolve().parents[2] / "docs" / "results" / folder
    if not (folder_path / f"fidelity_{dataset}.csv").exists():
        pytest.skip(f"docs/results/{folder} holds no {dataset} table yet (its bench is hours of training)")
    argv = ["bench", "fidelity", "--dataset", dataset, "--profile", "cpu", "--seeds", "0", "--rates", rates,
            *options, "--mia", "strong", "--floor-oracles", "2", "--work", str(tmp_path / "w"),
            "--merge-csv", str(folder_path / f"fidelity_{dataset}.csv"), "--out", str(tmp_path / "out")]
    assert main(argv) == 0 and "trained 0 model(s)" in capsys.readouterr().out
    again = _table_lines((tmp_path / "out" / f"fidelity_{dataset}.md").read_text())
    committed = _table_lines((folder_path / f"fidelity_{dataset}.md").read_text())
    # the audited request's seconds are not in a CSV written before its audited columns: that line aside
    kept = lambda lines: [x for x in lines if x and "audited, durable" not in x]  # noqa: E731
    assert kept(again) == kept(committed)
    assert any(x.startswith("| MUNKEY (key deletion) | M |") for x in again)
    if options == TUNED:
        assert any(x.startswith("| neggrad+ (tuned) | T |") for x in again) and any("Post-hoc settings" in x for x in again)
    else:
        assert not any("| T |" in x for x in again)
