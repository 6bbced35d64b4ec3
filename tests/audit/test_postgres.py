"""The audit log in a real PostgreSQL server (Debian's packages; `.ci/run` installs them).

The session starts a throwaway server: initdb into a temporary folder, listening on 127.0.0.1 on a
free port and on a unix socket in that folder, run as `nobody` when the tests run as root
(PostgreSQL refuses root), stopped at the end. Skipped only when the server binaries are absent.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from _helpers import cli, forked
from munkey_core.audit import log as audit
from munkey_core.audit import receipts
from munkey_core.cli import main
from munkey_core.run.rows import load_bank

psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed (pip install 'munkey-core[postgres]')")


def _pg_bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    exe = shutil.which("initdb")
    return Path(exe).parent if exe else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def pg_admin_url() -> str:
    bindir = _pg_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed: apt-get install postgresql")
    root = Path(tempfile.mkdtemp(prefix="munkey-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(root, "nobody")
        as_user = ["runuser", "-u", "nobody", "--"]
    data, port = root / "data", _free_port()

    def pg(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*as_user, *args], capture_output=True, text=True, timeout=120, cwd=root)

    init = pg(str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "--no-sync")
    assert init.returncode == 0, init.stderr
    start = pg(str(bindir / "pg_ctl"), "-D", str(data), "-l", str(root / "server.log"), "-w", "-t", "60", "-o",
               f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c fsync=off", "start")
    assert start.returncode == 0, start.stderr + (root / "server.log").read_text()
    admin = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    with psycopg.connect(admin, autocommit=True) as con:
        con.execute("CREATE ROLE munkey LOGIN PASSWORD 's3cret-pw'")
        con.execute("CREATE DATABASE munkey_audit OWNER munkey")
    try:
        yield admin
    finally:
        pg(str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop")
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_url(pg_admin_url: str) -> str:
    """The deployment's URL (with a password, which must never be written to the run directory)."""
    port = pg_admin_url.rsplit(":", 1)[1].split("/")[0]
    return f"postgresql://munkey:s3cret-pw@127.0.0.1:{port}/munkey_audit"


def _rows(url: str, run: Path) -> list[tuple]:
    run_id = json.loads((run / "audit.json").read_text())["run_id"]
    with psycopg.connect(url) as con:
        return con.execute("SELECT seq, kind, request_id FROM munkey_audit WHERE run_id = %s ORDER BY seq",
                           (run_id,)).fetchall()


def test_deletions_are_logged_in_postgres_and_verify(tiny_run: Path, pg_url: str, capsys) -> None:
    ids = load_bank(tiny_run).ids[:3].tolist()
    assert main(["forget", str(tiny_run), "--ids", ",".join(map(str, ids[:2])), "--operator", "pg-op",
                 "--no-evaluate", "--audit-url", pg_url, "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["deleted"] == ids[:2]
    binding = json.loads((tiny_run / "audit.json").read_text())
    assert binding["backend"] == "postgresql" and binding["location"].endswith("/munkey_audit")
    assert not any(b"s3cret-pw" in p.read_bytes() for p in tiny_run.rglob("*") if p.is_file())
    assert not (tiny_run / "audit.sqlite").exists()
    # the URL from the environment works too; a request without any URL is refused clearly
    os.environ["MUNKEY_AUDIT_URL"] = pg_url
    try:
        assert main(["forget", str(tiny_run), "--ids", "999999", "--operator", "pg-op", "--no-evaluate"]) == 2
        assert main(["forget", str(tiny_run), "--ids", str(ids[2]), "--operator", "pg-op", "--no-evaluate"]) == 0
    finally:
        del os.environ["MUNKEY_AUDIT_URL"]
    capsys.readouterr()
    assert main(["forget", str(tiny_run), "--ids", str(ids[2]), "--operator", "pg-op", "--no-evaluate"]) == 2
    assert "--audit-url" in capsys.readouterr().err
    assert [r[1] for r in _rows(pg_url, tiny_run)] == ["deletion", "refused", "deletion"]
    assert main(["audit", "verify", str(tiny_run), "--audit-url", pg_url]) == 0
    assert main(["audit", "verify-receipt", res["receipt"], str(tiny_run), "--audit-url", pg_url]) == 0
    assert "receipt VALID" in capsys.readouterr().out


def test_postgres_log_is_append_only_and_tampering_is_named(tiny_run: Path, pg_url: str, pg_admin_url: str,
                                                             capsys) -> None:
    ids = load_bank(tiny_run).ids[:2].tolist()
    for i in ids:
        assert main(["forget", str(tiny_run), "--ids", str(i), "--operator", "pg-op", "--no-evaluate",
                     "--audit-url", pg_url]) == 0
    run_id = json.loads((tiny_run / "audit.json").read_text())["run_id"]
    with psycopg.connect(pg_url) as con:
        with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
            con.execute("UPDATE munkey_audit SET kind = 'x' WHERE run_id = %s", (run_id,))
    with psycopg.connect(pg_admin_url.rsplit("/", 1)[0] + "/munkey_audit", autocommit=True) as con:
        con.execute("ALTER TABLE munkey_audit DISABLE TRIGGER USER")
        con.execute("UPDATE munkey_audit SET body = replace(body, 'pg-op', 'mallory') WHERE run_id = %s AND seq = 1",
                    (run_id,))
        con.execute("ALTER TABLE munkey_audit ENABLE TRIGGER USER")
    capsys.readouterr()
    assert main(["audit", "verify", str(tiny_run), "--audit-url", pg_url, "--json"]) == 1
    v = json.loads(capsys.readouterr().out)
    assert (v["first_bad_seq"], v["problem"]) == (1, "edited")


def test_runs_sharing_a_database_keep_separate_chains(tiny_run_template: Path, tmp_path: Path, pg_url: str) -> None:
    runs = [tmp_path / "a", tmp_path / "b"]
    for r in runs:
        shutil.copytree(tiny_run_template, r)
        assert main(["forget", str(r), "--ids", str(int(load_bank(r).ids[0])), "--operator", "o",
                     "--no-evaluate", "--audit-url", pg_url]) == 0
    for r in runs:
        assert [row[0] for row in _rows(pg_url, r)] == [1]
        assert audit.verify_run(r, pg_url).ok


def test_a_crash_after_the_postgres_commit_is_finished_on_open(tiny_run: Path, pg_url: str) -> None:
    from munkey_core.service import MunkeyRun

    MunkeyRun(tiny_run, device="cpu").split_keys("test")  # keys cached before forking
    victim = int(load_bank(tiny_run).ids[7])
    code = forked(cli("forget", str(tiny_run), "--ids", str(victim), "--operator", "o", "--no-evaluate",
                      "--audit-url", pg_url), env={"MUNKEY_CRASH_AT": "audit-committed"})
    assert code == -9
    assert (tiny_run / "audit_pending.json").exists() and (tiny_run / "journal.json").exists()
    run = MunkeyRun(tiny_run, device="cpu", audit_url=pg_url)
    assert victim not in run.bank and not (tiny_run / "journal.json").exists()
    assert [r[1] for r in _rows(pg_url, tiny_run)] == ["deletion"]  # recorded once, not twice
    v = audit.verify_run(tiny_run, pg_url)
    assert v.ok and v.entries == 1 and not v.notes
    rid = _rows(pg_url, tiny_run)[0][2]
    assert receipts.verify_receipt(receipts.load_receipt(tiny_run / "receipts" / f"{rid}.json"), tiny_run,
                                   pg_url)["ok"]
