"""Sample tags and saved grid views, kept in the run directory (`<run>/tags.json`); a deletion purges them.

Interface (what the dashboard and the deletion protocol use):
- `read_tags(root) -> TagStore`: the file's content (empty when there is no file); a damaged file
  raises MunkeyError saying how to recover (the run itself is unaffected).
- `add_tag(root, tag, ids)`, `remove_tag(root, tag, ids)`: tag / untag training samples still in
  the bank (other ids are skipped and reported); `save_view(root, name, view)`, `delete_view(root, name)`.
  Each is one read-modify-write of the file under the run's exclusive lock, written atomically
  (atomic.py): a crash leaves the old file or the new one.
- `purge_ids(root, ids)`: the deletion protocol's step (forget/request.py `apply_journal`, beside the
  map cache's purge, under the run's exclusive lock, idempotent): removes every deleted id from every
  tag, drops tags that only the deleted ids carried (their names were data about those samples, also
  from the views that filter by them), cuts the deleted ids out of every saved view's id ranges, and
  removes temp files a killed writer left. A damaged tags file is removed: it cannot be shown to hold
  no deleted id.

File format (JSON, format 1; no timestamp or other number besides ids and view settings):
    {"format": 1,
     "tags":  {"review": [12, 40], ...},                       # tag -> sorted training sample ids
     "views": {"my view": {"classes": [3], "id_ranges": [[40, 60]], "tags": ["review"],
                           "wrong": false, "low_confidence": 0.8}, ...}}
A view is the grid filter's settings (dashboard/gridfilter.py `GridFilter.to_view`); this module reads
only its `id_ranges` and `tags` (to purge them) and keeps the other fields as they are.
Why in the run: tags are data about samples and must leave with them, as the bank rows do.
Tests: tests/run/test_tags.py.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np

from munkey_core.atomic import atomic_write_bytes
from munkey_core.errors import MunkeyError
from munkey_core.run import rows
from munkey_core.run.lock import RunLock

TAGS_NAME = "tags.json"
FORMAT = 1
MAX_NAME = 60
_NAME = re.compile(r"^[\w][\w .:/+-]*$")


@dataclass
class TagStore:
    """Tags (name -> sorted ids) and saved views (name -> filter settings)."""

    tags: dict[str, list[int]] = field(default_factory=dict)
    views: dict[str, dict] = field(default_factory=dict)

    def ids_with(self, names: Iterable[str]) -> set[int]:
        """Ids carrying any of the tags `names`."""
        return {i for n in names for i in self.tags.get(n, [])}

    def tags_of(self, sample_id: int) -> list[str]:
        """The tags of one sample, sorted."""
        return sorted(n for n, ids in self.tags.items() if int(sample_id) in ids)

    def to_json(self) -> dict:
        return {"format": FORMAT, "tags": {n: sorted(set(map(int, ids))) for n, ids in sorted(self.tags.items())},
                "views": {n: self.views[n] for n in sorted(self.views)}}


def tags_path(root: str | Path) -> Path:
    return Path(root) / TAGS_NAME


def check_name(name: str, what: str = "tag") -> str:
    """A tag or view name, stripped; MunkeyError when empty, too long or with odd characters."""
    name = (name or "").strip()
    if not name or len(name) > MAX_NAME or not _NAME.match(name):
        raise MunkeyError(f"'{name}' cannot be a {what} name: use 1-{MAX_NAME} letters, digits, spaces or "
                          "'-_.:/+' (e.g. 'review', 'consent-withdrawn').")
    return name


def _damaged(path: Path, why: str) -> MunkeyError:
    return MunkeyError(f"The tags file {path} is damaged ({why}), so tags and saved views cannot be shown. Move it "
                       "away (or delete it) to start with no tags; the run itself is not affected.")


def _parse(path: Path, raw: bytes) -> TagStore:
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise _damaged(path, f"not JSON: {type(exc).__name__}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise _damaged(path, "not a tags file of format 1")
    tags, views = data.get("tags", {}), data.get("views", {})
    if not isinstance(tags, dict) or not isinstance(views, dict):
        raise _damaged(path, "'tags' and 'views' must be objects")
    out = TagStore()
    for name, ids in tags.items():
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise _damaged(path, f"tag '{name}' does not hold a list of ids")
        out.tags[str(name)] = sorted(set(ids))
    for name, view in views.items():
        if not isinstance(view, dict):
            raise _damaged(path, f"view '{name}' is not an object")
        ranges, tags_f = view.get("id_ranges", []), view.get("tags", [])
        if not (isinstance(ranges, list) and all(isinstance(r, list) and len(r) == 2 and all(
                isinstance(x, int) and not isinstance(x, bool) for x in r) for r in ranges)):
            raise _damaged(path, f"view '{name}' has id ranges that are not pairs of ids")
        if not (isinstance(tags_f, list) and all(isinstance(t, str) for t in tags_f)):
            raise _damaged(path, f"view '{name}' has tags that are not names")
        out.views[str(name)] = view
    return out


def read_tags(root: str | Path) -> TagStore:
    """The run's tags and saved views; empty when it has no tags file yet. Damaged: MunkeyError."""
    path = tags_path(root)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return TagStore()
    except OSError as exc:
        raise MunkeyError(f"Cannot read the tags file {path} ({exc.strerror}); check its permissions.") from None
    return _parse(path, raw)


def _write(root: Path, store: TagStore) -> None:
    try:
        atomic_write_bytes(tags_path(root), (json.dumps(store.to_json(), indent=1) + "\n").encode("utf-8"))
    except OSError as exc:
        raise MunkeyError(f"Cannot write the tags file in {root} ({exc.strerror}); the run directory is read-only "
                          "here. Nothing was changed.") from None


def _update(root: str | Path, change, lock: RunLock | None = None):
    """Read, change and write the file under the run's exclusive lock (no deletion in between)."""
    root = Path(root)
    with (lock or RunLock(root)).hold(exclusive=True):
        store = read_tags(root)
        result = change(store)
        _write(root, store)
    return result


def add_tag(root: str | Path, tag: str, ids: Iterable[int], lock: RunLock | None = None) -> dict:
    """Tag the `ids` still in the run's bank with `tag`. Returns {"tagged": [...], "skipped": [...]}
    (skipped: deleted or not training samples, which cannot carry tags). Nothing tagged: MunkeyError."""
    tag = check_name(tag)
    wanted = sorted({int(i) for i in ids})
    if not wanted:
        raise MunkeyError("Select at least one sample to tag.")

    def change(store: TagStore) -> dict:
        in_bank = np.isin(np.asarray(wanted, np.int64), rows.bank_ids(root))  # read under the lock
        ok = [i for i, k in zip(wanted, in_bank) if k]
        skipped = [i for i, k in zip(wanted, in_bank) if not k]
        if not ok:
            raise MunkeyError(f"None of the {len(wanted)} selected id(s) is a training sample still in the memory "
                              "bank, so none can be tagged (a deleted sample's tags are deleted with it).")
        store.tags[tag] = sorted(set(store.tags.get(tag, [])) | set(ok))
        return {"tagged": ok, "skipped": skipped}

    return _update(root, change, lock)


def remove_tag(root: str | Path, tag: str, ids: Iterable[int] | None = None, lock: RunLock | None = None) -> int:
    """Remove `tag` from `ids` (None: from every sample, deleting the tag). Returns how many lost it."""
    drop = None if ids is None else {int(i) for i in ids}

    def change(store: TagStore) -> int:
        have = store.tags.get(tag, [])
        keep = [] if drop is None else [i for i in have if i not in drop]
        if keep:
            store.tags[tag] = keep
        else:
            store.tags.pop(tag, None)
        return len(have) - len(keep)

    return _update(root, change, lock)


def save_view(root: str | Path, name: str, view: Mapping, lock: RunLock | None = None) -> str:
    """Save (or replace) the view `name` with the filter settings `view` (a JSON-able mapping)."""
    name = check_name(name, "view")
    view = json.loads(json.dumps(dict(view)))  # a plain JSON copy; refuses what JSON cannot hold

    def change(store: TagStore) -> None:
        store.views[name] = view

    _update(root, change, lock)
    return name


def delete_view(root: str | Path, name: str, lock: RunLock | None = None) -> bool:
    """Delete the saved view `name`; False when there was none."""
    return bool(_update(root, lambda store: store.views.pop(name, None) is not None, lock))


def subtract_ids(ranges: Iterable[Iterable[int]], ids: Iterable[int]) -> list[list[int]]:
    """Inclusive id ranges with `ids` cut out: [[40, 60]] minus {50} -> [[40, 49], [51, 60]]."""
    gone = sorted({int(i) for i in ids})
    out: list[list[int]] = []
    for lo, hi in ranges:
        lo, hi = int(lo), int(hi)
        for g in gone:
            if g < lo or g > hi:
                continue
            if g > lo:
                out.append([lo, g - 1])
            lo = g + 1
        if lo <= hi:
            out.append([lo, hi])
    return out


def purge_ids(root: str | Path, ids: Iterable[int]) -> bool:
    """Remove every trace of `ids` from the tags file (see the module docstring); the caller holds the
    run's exclusive lock (a deletion). Returns True when the file changed (or was removed)."""
    root = Path(root)
    path = tags_path(root)
    for tmp in root.glob(f".{TAGS_NAME}.*.tmp"):  # a temp file left by a writer that was killed
        tmp.unlink(missing_ok=True)
    gone = {int(i) for i in ids}
    try:
        store = read_tags(root)
    except MunkeyError:
        path.unlink(missing_ok=True)
        return True
    if not path.exists():
        return False
    changed = False
    emptied: set[str] = set()
    for name in list(store.tags):
        kept = [i for i in store.tags[name] if i not in gone]
        if len(kept) != len(store.tags[name]):
            changed = True
            if kept:
                store.tags[name] = kept
            else:
                del store.tags[name]
                emptied.add(name)
    for view in store.views.values():
        ranges = view.get("id_ranges")
        if isinstance(ranges, list) and ranges:
            cut = subtract_ids(ranges, gone)
            if cut != [[int(a), int(b)] for a, b in ranges]:
                view["id_ranges"] = cut
                changed = True
        tags = view.get("tags")
        if isinstance(tags, list) and set(tags) & emptied:
            view["tags"] = [t for t in tags if t not in emptied]
            changed = True
    if changed:
        _write(root, store)
    return changed
