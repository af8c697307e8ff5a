"""file:// adapter sources: a link anywhere in the path is refused, at registration and at every
later fetch (a link swapped in after registration, a loop, a middle folder, the leaf), and with no
``file_roots`` only a folder under the data dir is allowed."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import openai
import pytest
from platform_helpers import admin_headers

from loraplex.platform.adapters.sources.fetchers import SourceNotFound
from loraplex.platform.adapters.sources.local import FileFetcher, LinkRefused
from loraplex.platform.adapters.sources.resolver import AdapterResolver
from loraplex.platform.adapters.sources.uri import SourceRejected, parse_source
from loraplex.platform.settings import load_settings

H = admin_headers()
SECRET = "s" * 40  # two servers on one database: keys must hash alike
FILES = {"adapter_config.json": b"{}", "adapter_model.safetensors": b"\0" * 64}


def _folder(path: Path, files: dict[str, bytes]) -> Path:
    path.mkdir(parents=True)
    for name, data in files.items():
        (path / name).write_bytes(data)
    return path


def _fetch_all(fetcher: FileFetcher, path: Path, dest: Path) -> None:
    src = parse_source(f"file://{path}")
    dest.mkdir(exist_ok=True)
    for f in fetcher.list(src):
        fetcher.download(src, f, dest / f.name)


@pytest.fixture
def tree(tmp_path):
    """root/ (allowed) with root/a/b/adapter (real files) and root/../outside (a second adapter)."""
    root = tmp_path / "root"
    real = _folder(root / "a" / "b" / "adapter", FILES)
    outside = _folder(tmp_path / "outside" / "adapter", {**FILES, "README.md": b"secret"})
    return root, real, outside


def test_plain_folder_under_the_root_is_fetched(tree, tmp_path):
    root, real, _ = tree
    _fetch_all(FileFetcher([str(root)]), real, tmp_path / "copy")
    assert sorted(p.name for p in (tmp_path / "copy").iterdir()) == sorted(p.name for p in real.iterdir())


@pytest.mark.parametrize("where", ["middle", "leaf_folder", "file", "loop", "root_level"])
def test_a_link_anywhere_below_the_root_is_refused(tree, tmp_path, where):
    root, real, outside = tree
    fetcher = FileFetcher([str(root)])
    if where == "middle":  # root/evil -> ../outside : root/evil/adapter is the outside folder
        os.symlink(outside.parent, root / "evil")
        path = root / "evil" / "adapter"
    elif where == "leaf_folder":
        os.symlink(outside, root / "a" / "leaf")
        path = root / "a" / "leaf"
    elif where == "file":
        os.symlink("/etc/passwd", real / "README.md")
        path = real
    elif where == "loop":
        os.symlink(root / "a" / "loop", root / "a" / "loop")
        path = root / "a" / "loop" / "adapter"
    else:  # a link directly under the root, to a folder inside the root: still a link
        os.symlink(root / "a", root / "alias")
        path = root / "alias" / "b" / "adapter"
    with pytest.raises(LinkRefused, match="link"):
        _fetch_all(fetcher, path, tmp_path / "copy")
    assert not (tmp_path / "copy").exists() or not list((tmp_path / "copy").iterdir())


def test_dotdot_outside_and_special_files_are_refused(tree, tmp_path):
    root, real, outside = tree
    fetcher = FileFetcher([str(root)])
    for bad in (f"file://{root}/a/../../outside/adapter", f"file://{root}/..", f"{root}/a/b/../../../outside"):
        with pytest.raises(SourceRejected):
            fetcher.list(parse_source(bad))
    with pytest.raises(SourceRejected, match="outside the allowed"):
        fetcher.list(parse_source(f"file://{outside}"))
    with pytest.raises(SourceRejected, match="outside the allowed"):  # a prefix of a name is not the folder
        fetcher.list(parse_source(f"file://{root}x/adapter"))
    os.mkfifo(real / "README.md.fifo")
    with pytest.raises(SourceRejected, match="regular file"):
        fetcher.list(parse_source(f"file://{real}"))
    with pytest.raises(SourceNotFound):
        fetcher.list(parse_source(f"file://{root}/missing"))


def test_a_link_swapped_in_after_the_listing_is_refused_at_download(tree, tmp_path):
    """Time of check to time of use: the listing saw plain files; the adapter folder's parent is
    then replaced by a link to another folder with the same names. The download walks the path
    again without following links, so it refuses instead of reading the other folder."""
    root, real, outside = tree
    fetcher = FileFetcher([str(root)])
    src = parse_source(f"file://{real}")
    listed = fetcher.list(src)
    b = root / "a" / "b"
    b.rename(root / "a" / "b-old")
    os.symlink(outside.parent, b)
    (tmp_path / "copy").mkdir()
    with pytest.raises(LinkRefused):
        fetcher.download(src, listed[0], tmp_path / "copy" / listed[0].name)


def test_no_file_roots_allows_only_the_data_dir_folder(tmp_path):
    settings = load_settings(data_dir=tmp_path / "data", engine={"enabled": False})
    assert settings.adapters.file_roots == []
    resolver = AdapterResolver.from_settings(settings)
    try:
        default_root = tmp_path / "data" / "adapter-files"
        assert default_root.is_dir()
        inside = _folder(default_root / "mine", FILES)
        elsewhere = _folder(tmp_path / "elsewhere", FILES)
        assert resolver.fetch(f"file://{inside}").size_bytes == sum(len(v) for v in FILES.values())
        with pytest.raises(SourceRejected, match="outside the allowed"):
            resolver.fetch(f"file://{elsewhere}")
        with pytest.raises(SourceRejected, match="outside the allowed"):
            resolver.fetch("file:///etc")
    finally:
        resolver.close()


def _register(c: httpx.Client, name: str, path: Path, tid: str) -> httpx.Response:
    body = {"name": name, "source": f"file://{path}", "tenant_id": tid, "visibility": "private"}
    return c.post("/admin/v1/adapters", json=body)


@pytest.mark.slow
def test_link_refused_at_registration_and_at_serve_time(live_factory, tmp_path, good_files):
    """Over HTTP: a middle-component link is a 400 at registration; a folder registered clean and
    then swapped for a link is refused (4xx, not served, not a 5xx) when a node without a cached
    copy fetches it for a tenant's request."""
    root = tmp_path / "roots"
    real = _folder(root / "team" / "v1", good_files)
    outside = _folder(tmp_path / "secret" / "v1", good_files)
    settings = {"file_roots": [str(root)]}
    registrar = live_factory(adapters=settings, secret_key=SECRET)
    c = httpx.Client(base_url=registrar.url, headers=H, timeout=60)
    tid = c.post("/admin/v1/tenants", json={"name": "acme"}).json()["id"]
    key = c.post(f"/admin/v1/tenants/{tid}/keys", json={}).json()["key"]
    os.symlink(outside.parent, root / "evil")
    r = _register(c, "evil", root / "evil" / "v1", tid)
    assert r.status_code == 400 and r.json()["error"]["code"] == "link_refused", r.text
    assert _register(c, "clean", real, tid).status_code == 201
    # swapped after registration: same names, the folder is now a link to the secret one
    (root / "team").rename(root / "team-old")
    os.symlink(outside.parent, root / "team")
    node = live_factory(adapters=settings, secret_key=SECRET)  # its own, empty disk cache
    client = openai.OpenAI(base_url=node.url + "/v1", api_key=key, max_retries=0, timeout=120)
    with pytest.raises(openai.APIStatusError) as err:
        client.completions.create(model="clean", prompt="hi", max_tokens=4)
    assert err.value.status_code == 400, err.value.response.text
    body = err.value.response.json()["error"]
    assert body["code"] == "model_source_refused" and "link" in body["message"], body
    assert node.ctx.sources.resolver.counters["downloads"] == 0
