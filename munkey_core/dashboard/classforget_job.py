"""Class unlearning as a background job for the dashboard: per-round Af/Ar, comparisons, keep/discard.

`ClassUnlearnJob` runs one request (UnAct, or class key deletion and UnAct on a MUNKEY run) off the
UI thread. Before the first UnAct round, every `CURVE_EVERY` rounds and after the last, it measures Af
and Ar on a small stratified probe of the test split (`PROBE` images), so a page can draw the curve
while the job runs; then it measures the request on the editor's full test set and, when asked, the
comparison methods (SSD and LFSSD on a classifier run; key deletion alone and UnAct alone on a MUNKEY
run; masking the class's logit on both) on the same images.
The edited model stays in memory until `keep` saves it as a new run (or the job is dropped).
Tests: tests/app/test_app_class.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from munkey_core.data.sampling import stratified_sample
from munkey_core.unlearn.classforget import ClassEditor, ClassRequest, class_metrics
from munkey_core.errors import MunkeyError
from munkey_core.dashboard.jobs import BackgroundJob
from munkey_core.bank.memory import MemoryBank
from munkey_core.unlearn.unact import RoundInfo, UnActConfig

# 20 images a class on 10 classes: the curve shows the trend of every round (the request's own figures come
# from the full test set once); each round runs the edited blocks on PROBE x K (image, exemplar) pairs,
# so with the retain guard's 10-20 rounds this is most of a request's time (400 cost 2x the time)
PROBE = 200
# a curve point every 2nd round (and the last round's): the curve costs 1,600 pairs a point, more than the
# retain guard's probe, and it draws the same trend; the request's edit and figures do not depend on it
CURVE_EVERY = 2


def probe_index(editor: ClassEditor) -> np.ndarray:
    """The test rows of the per-round curve: a stratified sample of `PROBE` (seeded)."""
    return stratified_sample(editor.dataset.test.labels, PROBE, seed=1)


def warm_up(editor: ClassEditor) -> None:
    """Start computing what every request on `editor` measures and none changes (the unedited run on
    the test images and the probe), in the background, as soon as a page opens the editor."""
    editor.warm_up(probe_index(editor))


def comparison_methods(editor: ClassEditor, method: str) -> list[str]:
    """What a request with `method` is compared with on this kind of run."""
    if editor.kind == "classifier":
        return ["ssd", "lfssd", "mask"]
    return [m for m in ("keys", "unact", "keys+unact", "mask") if m != method]


class ClassUnlearnJob(BackgroundJob):
    """One class request with live per-round accuracies; `rows` holds the request and its comparisons."""

    name = "munkey-class-unlearning"
    what = "Class unlearning"

    def __init__(self, editor: ClassEditor, method: str, images_u8: np.ndarray, *, cls: int | None,
                 cfg: UnActConfig, compare: bool = True) -> None:
        super().__init__()
        self.editor, self.method, self.images, self.cls, self.cfg = editor, method, images_u8, cls, cfg
        self.compare = compare
        self.probe = probe_index(editor)
        self.reset()

    def reset(self) -> None:
        self.stage = "starting"
        self.curve: list[dict] = []           # {"round", "Af", "Ar"} on the probe images
        self.rounds_done = 0
        self.request: ClassRequest | None = None
        self.model: torch.nn.Module | None = None
        self.bank: MemoryBank | None = None
        self.rows: list[dict] = []
        self.saved: Path | None = None

    @property
    def fraction(self) -> float:
        if self.state == "done":
            return 1.0
        share = 0.6 if self.compare else 0.9
        return min(0.99, share * self.rounds_done / max(1, self.cfg.k))

    def _probe_point(self, round_no: int, model: torch.nn.Module, bank: MemoryBank | None, cls: int) -> None:
        ed = self.editor
        pred = ed.predict_test(model, bank, index=self.probe)
        m = class_metrics(pred, ed.dataset.test.labels[self.probe], cls, ed.num_classes)
        self.curve.append({"round": round_no, "Af": m.Af, "Ar": m.Ar})

    def task(self) -> None:
        ed = self.editor
        uses_unact = self.method in ("unact", "keys+unact")
        cls = ed.pseudo_label(self.images) if self.cls is None else int(self.cls)
        self.cls = cls
        bank = ed.class_bank(cls)[0] if self.method.startswith("keys") else None
        self.stage = "measuring the model before the request"
        self._probe_point(0, ed.model, bank if self.method == "keys" else None, cls)
        if uses_unact:
            self.stage = "UnAct rounds"

            def on_round(info: RoundInfo, model: torch.nn.Module) -> None:
                self.stage = f"UnAct round {info.round} of {self.cfg.k}"
                self.rounds_done = info.round
                if info.round % CURVE_EVERY == 0:
                    self._probe_point(info.round, model, bank, cls)

            req, model, bank_out = ed.request(self.method, self.images, cls=cls, cfg=self.cfg, on_round=on_round)
            if self.rounds_done > self.curve[-1]["round"]:  # the curve ends at the edit the request made
                self._probe_point(self.rounds_done, model, bank, cls)
        else:
            self.stage = f"{self.method}"
            req, model, bank_out = ed.request(self.method, self.images, cls=cls, cfg=self.cfg)
            self._probe_point(1, model, bank_out, cls)
        self.request, self.model, self.bank = req, model, bank_out
        self.rows = [req.as_row()]
        if self.compare:
            for other in comparison_methods(ed, self.method):
                self.stage = f"comparing with {other}"
                r, _, _ = ed.request(other, self.images, cls=cls, cfg=self.cfg)
                self.rows.append(r.as_row())
        self.stage = "done"

    def keep(self, out: str | Path, operator: str | None = None) -> Path:
        """Save the edited model as a new run (the original stays untouched)."""
        if self.state != "done" or self.request is None or self.model is None:
            raise MunkeyError("Nothing to keep yet: run the request and wait for it to finish.")
        self.saved = self.editor.save(out, self.model, self.request, operator=operator)
        return self.saved
