"""The CLI's contexts (thaw/contexts.py): written whole, read back, one current, unknown
names refused naming the known ones, a broken file named; and which API, token and CA a
command uses (thaw/cmdbase.py client_of)."""

from __future__ import annotations

import argparse
import os
import stat
import tomllib
from pathlib import Path

import pytest

from ground.appconfig import parse
from thaw import contexts
from thaw.appbuild import (
    CHECKED_AS,
    AppBuildError,
    BuildSpec,
    build_and_store,
    check_images,
    read_build,
)
from thaw.cmdbase import app_fields, client_of, url_of
from thaw.launch import BUILD_TABLE, render


@pytest.fixture(autouse=True)
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("THAW_CONFIG", str(tmp_path / "cfg"))
    monkeypatch.chdir(tmp_path)  # no ./.thaw here: only contexts give a token
    return tmp_path / "cfg"


def test_the_first_context_is_current_and_use_and_remove_move_it(config: Path) -> None:
    assert contexts.load() == contexts.Contexts()
    contexts.put("local", contexts.Context(api="http://127.0.0.1:5000"))
    contexts.put("prod", contexts.Context(api="https://api.example:443"))
    assert contexts.load().current == "local"  # a second one does not take over
    contexts.use("prod")
    assert contexts.chosen("") == contexts.Context(api="https://api.example:443")
    assert contexts.chosen("local").api == "http://127.0.0.1:5000"
    contexts.remove("prod")
    assert contexts.load().current == "" and contexts.chosen("") is None
    assert stat.S_IMODE(os.stat(config / contexts.FILE).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(config).st_mode) == 0o700


def test_an_unknown_or_bad_name_and_a_broken_file_are_errors_that_say_so(
    config: Path,
) -> None:
    contexts.put("local", contexts.Context(api="http://127.0.0.1:5000"))
    with pytest.raises(contexts.ContextError, match=r"no context 'nope' \(known: local"):
        contexts.chosen("nope")
    with pytest.raises(contexts.ContextError, match="a context name"):
        contexts.put("../x", contexts.Context(api="http://h:1"))
    (config / contexts.FILE).write_text("{not json")
    with pytest.raises(contexts.ContextError, match="not a contexts file"):
        contexts.load()


def args(**given: str) -> argparse.Namespace:
    return argparse.Namespace(**{"api": "", "token": "", "cacert": "", "context": "",
                                 **given})


def test_a_command_uses_the_contexts_api_token_and_ca_unless_given_an_api(
    tmp_path: Path,
) -> None:
    token_file = tmp_path / "admin.token"
    token_file.write_text("s3cret\n")
    ca = tmp_path / "ca.pem"
    contexts.put("up", contexts.Context(api="http://127.0.0.1:5123",
                                        token_file=str(token_file), cacert=str(ca)))
    client = client_of(args())
    assert (client.host, client.port, client.token) == ("127.0.0.1", 5123, "s3cret")
    elsewhere = client_of(args(api="http://127.0.0.1:6000"))  # an --api of its own
    assert (elsewhere.port, elsewhere.token) == (6000, "")  # never the context's token
    token_file.unlink()
    with pytest.raises(contexts.ContextError, match="token file"):
        client_of(args())


def test_with_no_context_the_default_api_is_the_local_one() -> None:
    assert client_of(args()).port == 4280


def test_a_thaw_toml_naming_its_context_picks_it_unless_a_context_is_given(
    tmp_path: Path,
) -> None:
    contexts.put("local", contexts.Context(api="http://127.0.0.1:5000"))
    contexts.put("prod", contexts.Context(api="http://127.0.0.1:5001"))
    toml = tmp_path / "thaw.toml"
    toml.write_text('context = "prod"\napp = "x"\nimage = "r/x:1"\n')
    assert client_of(args(config=toml)).port == 5001  # thaw.toml's, not the current one
    assert client_of(args()).port == 5001  # ./thaw.toml is read when no -c is given
    assert client_of(args(config=toml, context="local")).port == 5000  # --context wins
    assert client_of(args(config=toml, api="127.0.0.1:6000")).port == 6000
    assert app_fields({"context": "prod", "app": "x", "build": {}}) == {"name": "x"}
    toml.write_text('context = "gone"\n')
    with pytest.raises(contexts.ContextError, match="no context 'gone'"):
        client_of(args(config=toml))
    toml.write_text("context = 3\n")
    with pytest.raises(contexts.ContextError, match="context must be"):
        client_of(args(config=toml))


def test_an_apps_url_comes_from_its_contexts_template() -> None:
    contexts.put("up", contexts.Context(api="http://127.0.0.1:5000",
                                        app_url="http://{app}.localhost:8080/"))
    assert url_of(args(), "hello") == "http://hello.localhost:8080/"
    assert url_of(args(api="127.0.0.1:5000"), "hello") == ""  # no context: not known
    assert contexts.check_app_url("https://{app}.example.com/") == "https://{app}.example.com/"
    for bad in ("https://example.com/", "ftp://{app}.x/", "https://{app}.{app}.x/"):
        with pytest.raises(contexts.ContextError, match="--app-url"):
            contexts.check_app_url(bad)


def test_where_built_images_go_is_a_layout_by_absolute_path_or_a_registry() -> None:
    assert check_images("oci:/srv/images/layout") == "oci:/srv/images/layout"
    assert check_images("http://127.0.0.1:5000") == "http://127.0.0.1:5000"
    for bad in ("oci:relative/dir", "127.0.0.1:5000", "http://h:5000/some/path", "ftp://h"):
        with pytest.raises(AppBuildError, match="--images"):
            check_images(bad)


def test_thaw_tomls_build_table_is_read_checked_and_absent_is_none(tmp_path: Path) -> None:
    toml = tmp_path / "thaw.toml"
    assert read_build(toml) is None
    toml.write_text('app = "x"\n')
    assert read_build(toml) is None
    toml.write_text('app = "x"\n[build]\ndockerfile = "Dockerfile.prod"\nargs = {V = "2"}\n')
    assert read_build(toml) == BuildSpec(dockerfile="Dockerfile.prod", args={"V": "2"})
    toml.write_text('app = "x"\n[build]\ndockerfil = "D"\n')
    with pytest.raises(AppBuildError, match=r"\[build\].*known: dockerfile, dir, args"):
        read_build(toml)
    with pytest.raises(AppBuildError, match="keeps no images"):
        build_and_store(BuildSpec(), toml, "x", "")


def test_launch_writes_the_context_it_was_given_and_a_build_table_deploy_accepts() -> None:
    text = render({"name": "x"}, "prod") + BUILD_TABLE
    data = tomllib.loads(text)
    assert data["context"] == "prod" and data["build"] == {"dockerfile": "Dockerfile"}
    assert "image" not in data and "# image: the one thaw deploy builds" in text
    assert parse({"image": CHECKED_AS, **app_fields(data)}).name == "x"


def test_a_build_cannot_leave_thaw_tomls_directory_and_a_registry_url_is_plain(
    tmp_path: Path,
) -> None:
    project = tmp_path / "app"
    project.mkdir()
    (project / "Dockerfile").write_text("FROM scratch\n")
    toml = project / "thaw.toml"
    for spec in (BuildSpec(dir=".."), BuildSpec(dir="/etc"),
                 BuildSpec(dockerfile="../Dockerfile"), BuildSpec(dir="sub/../..")):
        with pytest.raises(AppBuildError, match="leaves"):
            build_and_store(spec, toml, "x", "oci:/tmp/unused")
    for bad in ("http://user:pw@127.0.0.1:5000", "http://127.0.0.1:5000?x=1",
                "http://127.0.0.1:5000#f"):
        with pytest.raises(AppBuildError, match="--images"):
            check_images(bad)


def test_contexts_a_newer_thaw_wrote_are_still_read(config: Path) -> None:
    config.mkdir(mode=0o700)
    (config / contexts.FILE).write_text(
        '{"current": "x", "contexts": {"x": {"api": "http://127.0.0.1:1", "new": 1}}}')
    assert contexts.chosen("").api == "http://127.0.0.1:1"
