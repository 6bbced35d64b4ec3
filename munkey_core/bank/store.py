"""A durable exemplar bank with O(1) physical deletion: one fixed-size file, rows updated in place.

Why: `MemoryBank.save` rewrites the whole bank for every request (O(N) on disk). Here a deletion
touches only the rows it moves, so a single-id delete costs the same at 10k and at 1M entries,
including the durable write, and the deleted bytes are overwritten on disk (no tombstone).

File layout (`<path>`, little-endian): a 4 KiB header (magic, JSON with the dims, dtype, capacity,
field names) then one contiguous region per field, each sized for `capacity` rows:
ids (int64) | labels (int64) | keys (capacity, Dk) | values (capacity, Dv) | each moment (capacity, Dv).
The live row count sits at a fixed header offset. Rows [count, capacity) are always zero.
Keys, values and moments are stored in `dtype` (float32, or float16 to halve the bytes per sample).

Deleting ids (one or a batch) = swap-with-last in every region:
1. the moves (hole row <- a kept tail row) are computed; the images of the *kept* rows being moved,
   the new count and a sha256 go to a redo file `<path>.redo`, which is fdatasync'ed (the request
   is now durable; the redo file never holds a deleted row's bytes);
2. the moved rows are written into the holes and rows [new_count, old_count) are overwritten with
   zeros (pwrite), the count is updated, the store is fdatasync'ed (the deleted bytes are now gone
   from the file on disk);
3. the redo record is invalidated (its magic overwritten; the file keeps its size so that its
   fdatasync is a pure data write, with no metadata commit).
A new record is zero-padded over whatever the previous (longer) record left behind, so the redo
file never keeps an older request's moved rows once one of them is deleted.
A crash anywhere leaves a state that `open` completes by replaying a valid redo record (replay is
idempotent; a torn record fails its checksum and means step 2 never started).
Cost per request: O(#deleted * row bytes) writes and two fdatasyncs of data blocks; independent of N
(the first request after a larger one also writes zeros over that one's longer record, once).
`delete_many` runs these steps for several stores at once (a forget request: the bank and every
checkpoint's row file): step 1 in every store, one round of flushes issued together, step 2 in every
store, one round of flushes, step 3. Each store keeps its own record and its own guarantees; the
request pays two rounds of concurrent flushes instead of two flushes per file one after another.
Reads go through a read-only memory map, so opening a 1M-row store costs no RAM until searched.
The id -> row dict (about 100 bytes per entry) is built on the first lookup that needs it; a
deletion on a freshly opened store finds its rows by a vectorised scan of the id column instead
(8 bytes per row read, no dict), so opening a store and deleting a few ids touches O(#deleted) rows.
`key_dim` may be 0: a checkpoint's rows (ids, labels, exemplars) need no key column.

Caveats: on copy-on-write filesystems (btrfs, ZFS) or SSD firmware an overwrite may leave old
blocks allocated until reused; that is true of every in-place or rename-based purge.
Tests: tests/bank/test_perf_bankstore.py.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Protocol, Sequence

import numpy as np

from munkey_core.errors import MunkeyError
from munkey_core.bank.rowmap import DeleteResult, bank_fingerprint, rows_in
from munkey_core.atomic import FolderFlushes, StagedFiles, flush_all, fsync_dir

if TYPE_CHECKING:  # torch and the in-memory bank only where used: a deletion's file steps need neither
    import torch

    from munkey_core.bank.memory import MemoryBank

MAGIC = b"MKYSTORE1\n"
HEADER_BYTES = 4096
_COUNT_OFFSET = 16          # int64 live row count
_JSON_OFFSET = 64           # length-prefixed JSON metadata
_REDO_MAGIC = b"MKYREDO1"
_DTYPES = {"float32": np.float32, "float16": np.float16}
_SEARCH_ROWS = 32_768        # bank rows scored per chunk in exact search (bounds temporary memory)


class DeleteListener(Protocol):
    """Something that mirrors row positions (an ANN index) and must follow swap-deletes."""

    def on_delete(self, removed_rows: np.ndarray, moves: list[tuple[int, int]]) -> None: ...


@dataclass
class StoreDeleteResult(DeleteResult):
    """A DeleteResult plus the row moves (target, source) that the delete performed."""

    moves: list[tuple[int, int]] = field(default_factory=list)


class BankStore:
    """Ids, labels, keys, exemplars and optimiser moments in one file; O(1) durable physical delete."""

    def __init__(self, path: str | Path, *, readonly: bool = False) -> None:
        """Open an existing store (replaying an unfinished deletion first); see `create`.

        `readonly`: for a reader that does not hold the writer's lock; it never replays a redo record
        (a writer may be applying it) and refuses to delete or append."""
        self.path = Path(path)
        if not self.path.exists():
            raise MunkeyError(f"No bank store at {self.path}. Create one with BankStore.create or from_bank.")
        self.readonly = readonly
        self.fsync = os.fdatasync  # the durability barrier (bench/perf.py swaps it to measure the rest)
        self._fd = os.open(self.path, os.O_RDONLY if readonly else os.O_RDWR)
        try:
            self._read_header()
            if not readonly:
                self._replay_redo()
            self._map()
        except BaseException:
            os.close(self._fd)
            raise
        self.listeners: list[DeleteListener] = []

    # ------------------------------------------------------------------ creation
    @classmethod
    def create(cls, path: str | Path, *, capacity: int, key_dim: int, value_dim: int,
               moment_names: Sequence[str] = (), dtype: str = "float32") -> "BankStore":
        """An empty store sized for `capacity` rows (sparse file: unused rows cost no disk blocks)."""
        if dtype not in _DTYPES:
            raise MunkeyError(f"Unknown bank dtype '{dtype}'; choose float32 or float16.")
        path = Path(path)
        meta = {"capacity": int(capacity), "key_dim": int(key_dim), "value_dim": int(value_dim),
                "moments": list(moment_names), "dtype": dtype}
        blob = json.dumps(meta).encode()
        if _JSON_OFFSET + 4 + len(blob) > HEADER_BYTES:
            raise MunkeyError("Too many moment fields for the bank store header.")
        header = bytearray(HEADER_BYTES)
        header[:len(MAGIC)] = MAGIC
        header[_COUNT_OFFSET:_COUNT_OFFSET + 8] = struct.pack("<q", 0)
        header[_JSON_OFFSET:_JSON_OFFSET + 4] = struct.pack("<I", len(blob))
        header[_JSON_OFFSET + 4:_JSON_OFFSET + 4 + len(blob)] = blob
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "wb") as f:
            f.write(header)
            f.truncate(HEADER_BYTES + _row_bytes(meta) * int(capacity))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
        redo = _redo_path(path)
        if redo.exists():
            redo.unlink()
        return cls(path)

    @classmethod
    def from_arrays(cls, path: str | Path, ids: np.ndarray, labels: np.ndarray, keys: np.ndarray,
                    values: np.ndarray, moments: dict[str, np.ndarray] | None = None, *,
                    dtype: str = "float32", capacity: int | None = None) -> "BankStore":
        """A store holding the given rows (capacity defaults to exactly len(ids))."""
        moments = moments or {}
        store = cls.create(path, capacity=capacity or len(ids), key_dim=keys.shape[1], value_dim=values.shape[1],
                           moment_names=list(moments), dtype=dtype)
        store.append(ids, labels, keys, values, moments)
        return store

    @classmethod
    def from_bank(cls, path: str | Path, bank: MemoryBank, *, dtype: str = "float32",
                  capacity: int | None = None) -> "BankStore":
        """Write a MemoryBank's rows (same row order) into a new store."""
        a = bank.to_arrays()
        moments = {k[len("moment_"):]: v for k, v in a.items() if k.startswith("moment_")}
        return cls.from_arrays(path, a["ids"], a["labels"], a["keys"], a["values"], moments, dtype=dtype,
                               capacity=capacity)

    def append(self, ids: np.ndarray, labels: np.ndarray, keys: np.ndarray, values: np.ndarray,
               moments: dict[str, np.ndarray] | None = None) -> None:
        """Add rows at the end (durable on return). Chunk large inputs to bound memory."""
        self._writable()
        ids = np.asarray(ids, dtype=np.int64)
        m = len(ids)
        moments = moments or {}
        if set(moments) != set(self.moment_names):
            raise MunkeyError(f"append needs moments {self.moment_names}, got {sorted(moments)}.")
        if self.count + m > self.capacity:
            raise MunkeyError(f"The bank store holds at most {self.capacity} rows; create it with a larger capacity.")
        dup = [int(i) for i in ids if int(i) in self._row]
        if dup or len(np.unique(ids)) != m:
            raise MunkeyError(f"Sample ids must be unique; already present or repeated: {dup[:5]}.")
        if getattr(self, "_redo_dirty", False):  # an applied redo record must not outlive new rows
            self.fsync(self._redo_fd())
            self._redo_dirty = False
        cols = {"ids": ids, "labels": np.asarray(labels, dtype=np.int64), "keys": keys, "values": values,
                **{f"m:{k}": v for k, v in moments.items()}}
        for name, arr in cols.items():
            arr = np.ascontiguousarray(arr, dtype=self._field_dtype(name))
            if len(arr) != m:
                raise MunkeyError(f"append: field '{name}' has {len(arr)} rows, expected {m}.")
            os.pwrite(self._fd, arr.tobytes(), self._offset(name, self.count))
        self.fsync(self._fd)
        rows = self._row
        for r, i in enumerate(ids.tolist()):
            rows[i] = self.count + r
        self._set_count(self.count + m)
        self.fsync(self._fd)

    # ------------------------------------------------------------------ reading
    def __len__(self) -> int:
        return self.count

    def __contains__(self, sample_id: int) -> bool:
        return int(sample_id) in self._row

    @property
    def ids(self) -> np.ndarray:
        return self._mm["ids"][:self.count]

    @property
    def labels(self) -> np.ndarray:
        return self._mm["labels"][:self.count]

    @property
    def keys(self) -> np.ndarray:
        """(N, Dk) read-only view of the file (no copy)."""
        return self._mm["keys"][:self.count]

    @property
    def values(self) -> np.ndarray:
        return self._mm["values"][:self.count]

    def moment(self, name: str) -> np.ndarray:
        return self._mm[f"m:{name}"][:self.count]

    def vacated_keys(self, n: int) -> np.ndarray:
        """(n, Dk) read-only view of the key rows just past the live ones (zeroed by every deletion)."""
        return self._mm["keys"][self.count:self.count + n]

    def rows_of(self, ids: Iterable[int]) -> np.ndarray:
        """Row positions of `ids` (all must be present)."""
        return rows_in(self._row, ids)

    def search(self, queries: torch.Tensor | np.ndarray, k: int,
               exclude: Sequence[Iterable[int]] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact cosine top-k over the file, chunked: same contract as MemoryBank.search.

        Memory: one (Q, 32768) score block plus one float32 copy of a 32768-row key chunk.
        """
        import torch

        q = torch.as_tensor(np.asarray(queries, dtype=np.float32))
        if q.ndim == 1:
            q = q[None]
        n = self.count
        if n == 0:
            raise MunkeyError("The memory bank is empty: every training sample has been deleted.")
        ex_rows = None
        if exclude is not None:
            ex_rows = [[self._row[int(i)] for i in e if int(i) in self._row] for e in exclude]
        max_excluded = max((len(list(e)) for e in exclude), default=0) if exclude is not None else 0
        k = max(1, min(k, n - max_excluded))
        best_s = torch.full((len(q), 0), float("-inf"))
        best_r = torch.zeros((len(q), 0), dtype=torch.int64)
        keys = self._mm["keys"]
        for start in range(0, n, _SEARCH_ROWS):
            stop = min(n, start + _SEARCH_ROWS)
            block = as_tensor(keys[start:stop])
            scores = q @ block.T  # (Q, rows)
            if ex_rows is not None:
                for j, rows in enumerate(ex_rows):
                    local = [r - start for r in rows if start <= r < stop]
                    if local:
                        scores[j, local] = float("-inf")
            s, r = torch.topk(scores, min(k, stop - start), dim=1)
            best_s = torch.cat([best_s, s], 1)
            best_r = torch.cat([best_r, r + start], 1)
            if best_s.shape[1] > k:
                best_s, pos = torch.topk(best_s, k, dim=1)
                best_r = torch.gather(best_r, 1, pos)
        return best_s, best_r

    def gather_keys(self, rows: np.ndarray) -> torch.Tensor:
        """float32 keys of the given rows (a copy)."""
        return as_tensor(self._mm["keys"][np.asarray(rows)])

    def to_bank(self) -> MemoryBank:
        """An in-memory MemoryBank copy (float32) with the same rows in the same order."""
        from munkey_core.bank.memory import MemoryBank

        moments = {k: np.array(self.moment(k), dtype=np.float32) for k in self.moment_names}
        return MemoryBank(np.array(self.ids), np.array(self.labels), np.array(self.keys, dtype=np.float32),
                          np.array(self.values, dtype=np.float32), moments)

    def fingerprint(self) -> str:
        """sha256 in id order, computed like MemoryBank.fingerprint (on float32 copies)."""
        return bank_fingerprint(np.array(self.ids), np.array(self.labels), np.asarray(self.keys, np.float32),
                                np.asarray(self.values, np.float32))

    # ------------------------------------------------------------------ deletion
    def delete(self, ids: Iterable[int]) -> StoreDeleteResult:
        """Physically remove ids (every field), durably; absent ids are reported, not an error."""
        return delete_many([(self, ids)])[0]

    def _plan(self, ids: Iterable[int]) -> "_DeletePlan":
        """The moves of a swap-with-last delete of `ids` and the kept rows' images (nothing written)."""
        self._writable()
        plan = _DeletePlan(StoreDeleteResult())
        wanted = unique_ids(ids)  # (m,) request order
        rows = self._rows_of(wanted)  # (m,) row of each id, -1 when absent
        hit = rows >= 0
        plan.rows, plan.result.deleted = rows[hit].tolist(), wanted[hit].tolist()
        plan.result.absent = wanted[~hit].tolist()
        if plan.rows:
            plan.n = self.count
            plan.n_after = plan.n - len(plan.rows)
            dead = np.zeros(plan.n, dtype=bool)
            dead[rows[hit]] = True
            holes = np.flatnonzero(dead[:plan.n_after])  # rows deleted below the new count, ascending
            sources = plan.n_after + np.flatnonzero(~dead[plan.n_after:])  # rows kept above it, ascending
            plan.moves = list(zip(holes.tolist(), sources.tolist()))
            plan.images = {name: np.array(self._mm[name][sources]) for name in self._fields}
        return plan

    def _done(self, plan: "_DeletePlan") -> None:
        """After a delete reached the disk: the id -> row dict and the listeners follow it."""
        if self._row_map is not None:
            for sample_id in plan.result.deleted:
                del self._row_map[sample_id]
            for (target, _), sid in zip(plan.moves, plan.images["ids"].tolist()):
                self._row_map[sid] = target
        plan.result.moves = plan.moves
        removed = np.array(plan.rows, dtype=np.int64)
        for listener in self.listeners:
            listener.on_delete(removed, plan.moves)

    def _writable(self) -> None:
        if self.readonly:
            raise MunkeyError(f"The bank store {self.path} was opened read-only; open it without readonly to change it.")

    def _rows_of(self, ids: np.ndarray) -> np.ndarray:
        """(m,) int64: the row of each id, -1 for an id not present; from the dict when built, else one
        sorted search of the id column (ids are unique in a store)."""
        if self._row_map is not None:
            return np.fromiter((self._row_map.get(i, -1) for i in ids.tolist()), dtype=np.int64, count=len(ids))
        col = np.asarray(self.ids)
        if len(col) == 0:
            return np.full(len(ids), -1, dtype=np.int64)
        order = np.argsort(col, kind="stable")
        at = np.minimum(np.searchsorted(col[order], ids), len(col) - 1)
        return np.where(col[order[at]] == ids, order[at], -1).astype(np.int64)

    @property
    def _row(self) -> dict[int, int]:
        """id -> row of every live row, built on first use."""
        if self._row_map is None:
            self._row_map = dict(zip(self._mm["ids"][:self.count].tolist(), range(self.count)))
        return self._row_map

    def _apply(self, n: int, n_after: int, moves: list[tuple[int, int]], images: dict[str, np.ndarray],
               sync: bool = True) -> None:
        """Write moved rows into their holes, zero the vacated tail, set the count, fdatasync (unless
        `sync` is False: `delete_many` flushes a group of stores together)."""
        targets = [t for t, _ in moves]
        runs = _runs(targets)  # (first move, end move): consecutive targets, one write each
        for name in self._fields:
            width = self._width(name)
            if width == 0:
                continue
            data = memoryview(np.ascontiguousarray(images[name]).tobytes())  # row j at j * width
            base = self._offset(name, 0)
            for a, b in runs:
                os.pwrite(self._fd, data[a * width:b * width], base + targets[a] * width)
            if n > n_after:
                _write_zeros(self._fd, (n - n_after) * width, self._offset(name, n_after))
        self._set_count(n_after)
        if sync:
            self.fsync(self._fd)

    # ------------------------------------------------------------------ redo record
    def _write_redo(self, n: int, n_after: int, moves: list[tuple[int, int]], images: dict[str, np.ndarray],
                    sync: bool = True) -> None:
        parts = [struct.pack("<qqq", n, n_after, len(moves)), np.array([t for t, _ in moves], dtype=np.int64).tobytes()]
        parts += [np.ascontiguousarray(images[name]).tobytes() for name in self._fields]
        body = b"".join(parts)
        record = _REDO_MAGIC + struct.pack("<q", len(body)) + body + hashlib.sha256(body).digest()
        fd = self._redo_fd()
        size = os.fstat(fd).st_size
        # Zero what is left of the previous record past this one: it holds rows that were kept then
        # and may be deleted now (this request), and must not outlive them. Beyond the previous
        # record the file is already zero (each write pads this way), so only its length matters.
        stale = _record_end(os.pread(fd, 16, 0), size)
        record += bytes(max(0, stale - len(record)))
        if len(record) > size:  # grow rarely (doubling): a size change costs a metadata commit
            os.ftruncate(fd, max(len(record), 2 * size, 1 << 16))
        os.pwrite(fd, record, 0)
        if sync:
            self.fsync(fd)

    def _clear_redo(self) -> None:
        """Invalidate the applied record (its magic is overwritten). Not synced: replaying an applied
        record is harmless until rows are appended, and `append` syncs the redo file first."""
        os.pwrite(self._redo_fd(), bytes(len(_REDO_MAGIC)), 0)
        self._redo_dirty = True

    def update_pending(self) -> bool:
        """True when the redo file holds a valid record not yet cleared: a deletion that a writer is
        applying or that was interrupted (opening the store without `readonly` finishes it)."""
        return self._redo_body() is not None

    def _redo_body(self) -> bytes | None:
        """The body of a valid (complete, checksummed, uncleared) redo record, else None."""
        redo = _redo_path(self.path)
        if not redo.exists():
            return None
        data = redo.read_bytes()
        if len(data) < 16 or data[:8] != _REDO_MAGIC:
            return None  # cleared, empty or torn before the header: nothing to finish
        (length,) = struct.unpack("<q", data[8:16])
        body, digest = data[16:16 + length], data[16 + length:16 + length + 32]
        if len(body) != length or hashlib.sha256(body).digest() != digest:
            return None  # torn record: step 2 never started, the store is unchanged
        return body

    def _replay_redo(self) -> None:
        body = self._redo_body()
        if body is None:
            return
        n, n_after, m = struct.unpack("<qqq", body[:24])
        count = self._read_count()
        if count not in (n, n_after):
            raise MunkeyError(f"The bank store {self.path} and its redo record disagree (count {count}, "
                              f"record {n}->{n_after}); restore the run from a backup.")
        pos = 24
        targets = np.frombuffer(body, dtype=np.int64, count=m, offset=pos)
        pos += 8 * m
        images = {}
        for name in self._fields:
            nbytes = m * self._width(name)
            images[name] = np.frombuffer(body, dtype=np.uint8, count=nbytes, offset=pos).reshape(m, self._width(name))
            pos += nbytes
        self._apply(n, n_after, [(int(t), -1) for t in targets], images)
        self._clear_redo()
        self.fsync(self._redo_fd())

    def _redo_fd(self) -> int:
        if self._open_redo():  # the directory entry needs a flush only when the file was just created
            fsync_dir(self.path.parent)
        return self._rfd

    def _open_redo(self) -> bool:
        """Open the redo file (once); True when this call created it: the caller flushes its folder
        before relying on the file (`delete_many` flushes each folder once for a group)."""
        if getattr(self, "_rfd", None) is not None:
            return False
        try:
            self._rfd = os.open(_redo_path(self.path), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            return True
        except FileExistsError:
            self._rfd = os.open(_redo_path(self.path), os.O_RDWR)
            return False

    # ------------------------------------------------------------------ layout
    def _read_header(self) -> None:
        head = os.pread(self._fd, HEADER_BYTES, 0)
        if len(head) < HEADER_BYTES or not head.startswith(MAGIC):
            raise MunkeyError(f"{self.path} is not a MUNKEY bank store (damaged or truncated: bad header); "
                              "restore the run from a backup.")
        (length,) = struct.unpack("<I", head[_JSON_OFFSET:_JSON_OFFSET + 4])
        try:
            self.meta = json.loads(head[_JSON_OFFSET + 4:_JSON_OFFSET + 4 + length])
            [self.meta[k] for k in ("capacity", "key_dim", "value_dim", "moments", "dtype")]
        except (ValueError, KeyError, TypeError):
            raise MunkeyError(f"{self.path} is not a MUNKEY bank store (damaged: unreadable header); restore the "
                              "run from a backup.") from None
        self.capacity = int(self.meta["capacity"])
        self.key_dim = int(self.meta["key_dim"])
        self.value_dim = int(self.meta["value_dim"])
        self.moment_names: list[str] = list(self.meta["moments"])
        self.dtype = self.meta["dtype"]
        self._fields = ["ids", "labels", "keys", "values", *[f"m:{k}" for k in self.moment_names]]
        self._offsets: dict[str, int] = {}
        off = HEADER_BYTES
        for name in self._fields:
            self._offsets[name] = off
            off += self._width(name) * self.capacity
        expected = off
        if os.fstat(self._fd).st_size != expected:
            raise MunkeyError(f"The bank store {self.path} is damaged or truncated (wrong size); restore the run "
                              "from a backup.")

    def _map(self) -> None:
        """One read-only shared map of the whole file (through the open descriptor), viewed per field:
        the views follow every pwrite; no copy is made. (One map instead of a np.memmap per field,
        each of which opened the file again by its path: ~1 ms per field and store.)"""
        self.count = self._read_count()
        self._mm: dict[str, np.ndarray] = {}
        whole = mmap.mmap(self._fd, 0, access=mmap.ACCESS_READ)  # closed when the last view is dropped
        for name in self._fields:
            shape = (self.capacity,) if name in ("ids", "labels") else (self.capacity, self._cols(name))
            if self.capacity == 0 or self._width(name) == 0:  # nothing to view
                self._mm[name] = np.zeros(shape, dtype=self._field_dtype(name))
            else:
                self._mm[name] = np.frombuffer(whole, dtype=self._field_dtype(name), count=int(np.prod(shape)),
                                               offset=self._offsets[name]).reshape(shape)
        self._row_map: dict[int, int] | None = None

    def _cols(self, name: str) -> int:
        return 1 if name in ("ids", "labels") else (self.key_dim if name == "keys" else self.value_dim)

    def _field_dtype(self, name: str) -> type:
        return np.int64 if name in ("ids", "labels") else _DTYPES[self.dtype]

    def _width(self, name: str) -> int:
        return self._cols(name) * np.dtype(self._field_dtype(name)).itemsize

    def _offset(self, name: str, row: int) -> int:
        return self._offsets[name] + row * self._width(name)

    def _read_count(self) -> int:
        return struct.unpack("<q", os.pread(self._fd, 8, _COUNT_OFFSET))[0]

    def _set_count(self, n: int) -> None:
        os.pwrite(self._fd, struct.pack("<q", n), _COUNT_OFFSET)
        self.count = n

    @property
    def row_bytes(self) -> int:
        """Bytes one sample occupies in the file (all fields)."""
        return sum(self._width(name) for name in self._fields)

    def close(self) -> None:
        """Release the file descriptors and the memory map."""
        self._mm = {}  # the maps close when the last view of them is dropped
        for attr in ("_fd", "_rfd"):
            fd = getattr(self, attr, None)
            if fd is not None:
                os.close(fd)
                setattr(self, attr, None)

    def __enter__(self) -> "BankStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class _DeletePlan:
    """One store's part of a delete: the rows going, the moves (hole, kept tail row), their images."""

    result: StoreDeleteResult
    rows: list[int] = field(default_factory=list)
    n: int = 0
    n_after: int = 0
    moves: list[tuple[int, int]] = field(default_factory=list)
    images: dict[str, np.ndarray] = field(default_factory=dict)


def delete_many(requests: Sequence[tuple[BankStore, Iterable[int]]], files: Sequence[tuple[Path, bytes]] = (),
                after_files: Callable[[], None] | None = None) -> list[StoreDeleteResult]:
    """Delete ids from several stores (the bank and every checkpoint row file) as one group commit,
    with each store's guarantees unchanged: every store's redo record is written, then all of them are
    flushed; only then are the rows moved and zeroed in every store, and all stores flushed; then the
    records are invalidated. A crash before the first group flush ends leaves every store unchanged
    (a torn or unflushed record is ignored); after it, every store that changed holds a valid record,
    which the next open replays. Per store: the same writes as a delete on its own; flushes: two
    rounds for the whole group instead of two per store one after another. Returns each request's
    result, in order.

    `files` (path, bytes) are replaced atomically in the same two rounds (a deletion's forgotten.json
    and purged derived files, forget/request.py): written to temporary files and flushed with the
    redo records (round 1), renamed before any row moves (then `after_files` runs), their folders
    flushed with the stores (round 2). Each is old or new after a crash, never a mix, and durable on
    return, as with atomic.py `atomic_write_many` called before the delete; the folder of a redo file
    made now (a run's first deletion) is flushed in round 1 too, before any row relies on it."""
    plans = [store._plan(ids) for store, ids in requests]
    busy = [(store, plan) for (store, _), plan in zip(requests, plans) if plan.rows]
    if not busy and not files:
        return [plan.result for plan in plans]
    staged = StagedFiles(files)
    try:
        # redo files made now (a run's first deletion): each folder's entries flushed once, in round 1
        made = FolderFlushes([store.path.parent for store, _ in busy if store._open_redo()])
        try:
            for store, p in busy:
                store._write_redo(p.n, p.n_after, p.moves, p.images, False)
            # round 1: every request durable, every new file's bytes on disk
            flush_all([(store.fsync, store._redo_fd()) for store, _ in busy] + made.flushes() + staged.flushes())
        finally:
            made.close()
    except BaseException:
        staged.discard()
        raise
    renamed = FolderFlushes(staged.rename())
    try:
        if after_files is not None:
            after_files()
        for store, p in busy:
            store._apply(p.n, p.n_after, p.moves, p.images, False)  # positional: tests stub _apply
        # round 2: the deleted bytes gone from disk, the renames durable
        flush_all([(store.fsync, store._fd) for store, _ in busy] + renamed.flushes())
    finally:
        renamed.close()
    for store, p in busy:
        store._clear_redo()
        store._done(p)
    return [plan.result for plan in plans]


_ZEROS: list[bytes] = []  # one zero buffer for every vacated tail (a fresh one per write cost page faults)


def _write_zeros(fd: int, nbytes: int, offset: int) -> None:
    """Overwrite `nbytes` at `offset` with zeros, in writes of at most 4 MiB from one shared buffer."""
    if not _ZEROS:
        _ZEROS.append(bytes(4 << 20))
    zeros = memoryview(_ZEROS[0])
    while nbytes > 0:
        step = min(nbytes, len(zeros))
        os.pwrite(fd, zeros[:step], offset)
        offset, nbytes = offset + step, nbytes - step


def unique_ids(ids: Iterable[int]) -> np.ndarray:
    """(m,) int64: `ids` without repeats, in the order of their first occurrence; vectorised for a 1-D
    int64 array (a group delete plans every store with the same ids: converted once by the caller)."""
    if isinstance(ids, np.ndarray) and ids.dtype == np.int64 and ids.ndim == 1:
        order = np.argsort(ids, kind="stable")  # equal ids stay in their order: the first one leads
        first = np.ones(len(ids), dtype=bool)
        first[1:] = ids[order[1:]] != ids[order[:-1]]
        return ids[np.sort(order[first])]
    return np.fromiter(dict.fromkeys(int(i) for i in ids), dtype=np.int64)


def _runs(targets: list[int]) -> list[tuple[int, int]]:
    """[(a, b)]: maximal stretches targets[a:b] of consecutive rows (t, t + 1, ...)."""
    out, start = [], 0
    for j in range(1, len(targets) + 1):
        if j == len(targets) or targets[j] != targets[j - 1] + 1:
            out.append((start, j))
            start = j
    return out


def _redo_path(path: Path) -> Path:
    return path.with_name(path.name + ".redo")


def _record_end(head: bytes, size: int) -> int:
    """End offset of the redo record whose first 16 bytes are `head` (its length survives the clear,
    which overwrites only the magic); the whole file when that length is unreadable (a torn write)."""
    if len(head) < 16:
        return 0
    (length,) = struct.unpack("<q", head[8:16])
    end = 16 + length + 32
    return end if 0 <= length and end <= size else size


def _row_bytes(meta: dict) -> int:
    item = np.dtype(_DTYPES[meta["dtype"]]).itemsize
    return 16 + item * (meta["key_dim"] + meta["value_dim"] * (1 + len(meta["moments"])))


def as_tensor(a: np.ndarray) -> torch.Tensor:
    """float32 tensor from a (possibly read-only, possibly float16) array, copying only if needed."""
    import torch

    if a.dtype != np.float32:
        return torch.from_numpy(a.astype(np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only memmap: we never write through it
        return torch.from_numpy(np.asarray(a))
