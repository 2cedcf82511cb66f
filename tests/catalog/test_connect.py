"""Connecting: the embedded server (reuse across processes, long IMP_HOME), and unreachable or invalid URLs."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import sqlalchemy as sa

from imp_core.catalog import Catalog
from imp_core.catalog.embedded import embedded_url, socket_dir, stop_embedded
from imp_core.config import Settings
from imp_core.errors import CatalogError


@pytest.mark.postgres  # tries to connect (psycopg2), which the marker guard counts once psycopg2 is loaded
def test_unreachable_catalog_url_names_it_with_the_password_hidden(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, catalog_url="postgresql+psycopg2://u:secret@127.0.0.1:1/x")
    with pytest.raises(CatalogError) as caught:
        Catalog.connect(settings)
    message = str(caught.value)
    assert "postgresql+psycopg2://u:***@127.0.0.1:1/x" in message
    assert "secret" not in message
    assert "IMP_CATALOG_URL" in message


@pytest.mark.parametrize("url", ["not a url", "sqlite:///x.db", "postgresql+nodriver://u:pw@h/x"])
def test_invalid_catalog_url(tmp_path: Path, url: str) -> None:
    with pytest.raises(CatalogError, match="URL"):
        Catalog.connect(Settings(home=tmp_path, catalog_url=url))


@pytest.mark.postgres
def test_embedded_server_is_reused_by_another_process(embedded_settings: Settings) -> None:
    url = embedded_url(embedded_settings)
    pid = (embedded_settings.embedded_pgdata / "postmaster.pid").read_text().splitlines()[0]
    code = ("import sys; from pathlib import Path; from imp_core.config import Settings; "
            "from imp_core.catalog.embedded import embedded_url; "
            "print(embedded_url(Settings(home=Path(sys.argv[1]))))")
    out = subprocess.run([sys.executable, "-c", code, str(embedded_settings.home)], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == url
    # Same postmaster: the other process attached instead of starting a second server.
    assert (embedded_settings.embedded_pgdata / "postmaster.pid").read_text().splitlines()[0] == pid
    assert url.startswith("postgresql+psycopg2://postgres@/imp?host=")
    assert "passfile=" in url and sa.make_url(url).password is None  # the password stays in its private file


@pytest.mark.postgres
def test_embedded_catalog_with_a_long_imp_home() -> None:
    # A unix socket path may have ~107 bytes; pgdata here is far longer, so clients go through the postmaster's
    # /proc/<pid>/cwd (which only its own user and root may follow) instead of a directory somewhere shared.
    root = Path(tempfile.mkdtemp(prefix="imp-long-", dir="/tmp"))
    home = root / ("h" * 60) / ("o" * 60) / "imp-home"
    settings = Settings(home=home)
    try:
        url = embedded_url(settings)
        sockets = socket_dir(url)
        pid = (settings.embedded_pgdata / "postmaster.pid").read_text().splitlines()[0]
        assert sockets == Path(f"/proc/{pid}/cwd")
        assert (sockets / ".s.PGSQL.5432").resolve() == settings.embedded_pgdata.resolve() / ".s.PGSQL.5432"
        catalog = Catalog.connect(Settings(home=home))
        try:
            catalog.register_table("t", "/wh/t")
            assert [t.name for t in catalog.list_tables()] == ["t"]
            assert catalog.engine.url.database == "imp"
        finally:
            catalog.close()
        assert stop_embedded(settings) is True
        assert stop_embedded(settings) is False
        # Restart in the same process after a stop: a new postmaster, so a new alias; the data is still there.
        again = embedded_url(settings)
        engine = sa.create_engine(again, poolclass=sa.pool.NullPool)
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT name FROM source_table")).scalars().all() == ["t"]
        engine.dispose()
    finally:
        stop_embedded(settings)
        shutil.rmtree(root, ignore_errors=True)
