"""Image builds: content-hash tags, planning, and real Docker builds.

Tests marked ``docker`` talk to a real engine (see tests/docker_support.py); they build on a local
Debian + torch base image that stands in for nvcr.io's, since no registry is reachable here.
"""

from __future__ import annotations

import contextlib
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from orchestrator import cli
from orchestrator.catalog import templates
from orchestrator.errors import BackendUnavailable, BuildError
from orchestrator.images import build

# --------------------------------------------------------------------------- helpers


@pytest.fixture
def workload(tmp_path: Path) -> Path:
    """A private copy of the repository's workload/ (so tests may change it) plus a marker."""
    target = tmp_path / "workload"
    shutil.copytree(
        templates.WORKLOAD_DIR, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    (target / "orchestrate_test_marker.py").write_text("MARKER = 'inside'\n")
    return target


@pytest.fixture
def bitfusion_stub_files(tmp_path: Path) -> dict[str, str]:
    deb = tmp_path / "client.deb"
    deb.write_bytes(b"not really a deb")
    cert = tmp_path / "ca.crt"
    cert.write_text("dummy")
    return {"client_deb": str(deb), "ca_cert": str(cert)}


# --------------------------------------------------------------------------- planning (no Docker)


def test_plan_is_stable_and_tag_has_12_hex(workload: Path) -> None:
    first = build.plan_image("ngc-pytorch", {}, workload_dir=workload)
    second = build.plan_image("ngc-pytorch", {}, workload_dir=workload)
    assert first == second
    repo, _, digest = first.tag.partition(":")
    assert repo == "orchestrate/ngc-pytorch"
    assert re.fullmatch(r"[0-9a-f]{12}", digest)
    assert first.content_hash.startswith(digest)
    assert first.base_image == "nvcr.io/nvidia/pytorch:24.05-py3"
    assert first.values["base_tag"] == "24.05-py3"  # resolved: defaults included


def test_tag_changes_with_workload_variables_and_base(workload: Path) -> None:
    tag = build.plan_image("ngc-pytorch", {}, workload_dir=workload).tag
    (workload / "orchestrate_test_marker.py").write_text("MARKER = 'changed'\n")
    changed_file = build.plan_image("ngc-pytorch", {}, workload_dir=workload).tag
    (workload / "new_module.py").write_text("")
    added_file = build.plan_image("ngc-pytorch", {}, workload_dir=workload).tag
    variable = build.plan_image(
        "ngc-pytorch", {"apt_packages": ["numactl"]}, workload_dir=workload
    ).tag
    base = build.plan_image("ngc-pytorch", {"base_tag": "23.10-py3"}, workload_dir=workload).tag
    assert len({tag, changed_file, added_file, variable, base}) == 5


def test_bytecode_caches_do_not_change_the_tag(workload: Path) -> None:
    tag = build.plan_image("ngc-pytorch", {}, workload_dir=workload).tag
    (workload / "__pycache__").mkdir(exist_ok=True)
    (workload / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0\1")
    assert build.plan_image("ngc-pytorch", {}, workload_dir=workload).tag == tag


def test_bitfusion_builds_on_the_ngc_content_hash_tag(
    workload: Path, bitfusion_stub_files: dict[str, str]
) -> None:
    plan = build.plan_image("bitfusion", bitfusion_stub_files, workload_dir=workload)
    parent = build.plan_image("ngc-pytorch", {}, workload_dir=workload)
    assert plan.parent == parent
    assert plan.base_image == parent.tag
    assert plan.values["parent_image"] == parent.tag
    assert [p.template for p in build.plan_chain(plan)] == ["ngc-pytorch", "bitfusion"]

    # A change in the parent's inputs changes both tags.
    other = build.plan_image(
        "bitfusion", {**bitfusion_stub_files, "base_tag": "23.10-py3"}, workload_dir=workload
    )
    assert other.parent is not None and other.parent.tag != parent.tag
    assert other.tag != plan.tag

    # So does a change in the client package.
    Path(bitfusion_stub_files["client_deb"]).write_bytes(b"another client")
    assert build.plan_image("bitfusion", bitfusion_stub_files, workload_dir=workload).tag != (
        plan.tag
    )

    # An explicit parent image means no parent plan.
    pinned = build.plan_image(
        "bitfusion",
        {**bitfusion_stub_files, "parent_image": "lab/pytorch:1"},
        workload_dir=workload,
    )
    assert pinned.parent is None and pinned.base_image == "lab/pytorch:1"


def test_singularity_is_planned_but_not_built_by_docker(workload: Path) -> None:
    plan = build.plan_image("singularity", {}, workload_dir=workload)
    assert plan.kind == "singularity"
    with pytest.raises(BuildError, match="apptainer build"):
        build.ensure_image(plan, client=object())


def test_no_engine_is_backend_unavailable(
    workload: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-such-docker.sock")
    plan = build.plan_image("ngc-pytorch", {}, workload_dir=workload)
    with pytest.raises(BackendUnavailable) as err:
        build.ensure_image(plan)
    message = str(err.value)
    assert "dockerd" in message and "--backend process" in message


# --------------------------------------------------------------------------- CLI (no Docker)


def test_cli_dry_run_resolves_release_from_driver(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["images", "build", "ngc-pytorch", "--driver", "535.129.03", "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0
    assert "23.10" in out and "CUDA 12.2.2" in out
    assert "nvcr.io/nvidia/pytorch:23.10-py3" in out
    assert "orchestrate/ngc-pytorch:" in out


def test_cli_driver_and_base_tag_conflict(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(
        [
            "images",
            "build",
            "ngc-pytorch",
            "--driver",
            "550.54.15",
            "--set",
            "base_tag=x",
            "--dry-run",
        ]
    )
    assert code == 2
    assert "either --driver or --set base_tag" in capsys.readouterr().err


def test_cli_unknown_variable_is_a_clean_error(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["images", "build", "ngc-pytorch", "--set", "bse_tag=1", "--dry-run"])
    assert code == 2
    err = capsys.readouterr().err
    assert "bse_tag" in err and "known: " in err and "Traceback" not in err


def test_cli_render_writes_context(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ctx"
    code = cli.main(["images", "render", "habana", "--set", "os=ubuntu24.04", "--out", str(out)])
    assert code == 0
    dockerfile = (out / "Dockerfile").read_text()
    assert "/ubuntu24.04/habanalabs/" in dockerfile
    assert "ENV PT_HPU_LAZY_MODE" not in dockerfile  # the Gaudi mode is per cell
    assert (out / "workload").is_dir()


def test_cli_list_without_engine(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-such-docker.sock")
    assert cli.main(["images", "list"]) == 0
    out = capsys.readouterr().out
    for name in templates.template_names():
        assert name in out
    assert "base_tag" in out and "no Docker engine reachable" in out


# --------------------------------------------------------------------------- real Docker builds


@pytest.fixture
def built_tags(docker_client: Any) -> Iterator[list[str]]:
    """Tags a test builds; removed afterwards so every run builds from scratch."""
    tags: list[str] = []
    yield tags
    for tag in reversed(tags):
        with contextlib.suppress(docker.errors.ImageNotFound):  # already gone is fine
            docker_client.images.remove(tag, force=True)


def _fresh(docker_client: Any, plan: build.ImagePlan, tags: list[str]) -> None:
    """Forget any earlier build of ``plan`` (and its parents), and remember to clean up."""
    for node in build.plan_chain(plan):
        tags.append(node.tag)
        with contextlib.suppress(docker.errors.ImageNotFound):  # not there: fine
            docker_client.images.remove(node.tag, force=True)


def _run(docker_client: Any, tag: str, command: list[str]) -> str:
    output = docker_client.containers.run(tag, command, remove=True, network_disabled=True)
    return output.decode()


def _pinned(docker_client: Any, plan: build.ImagePlan) -> build.ImagePlan:
    """``plan`` pinned to its base on the test engine (what ensure_image builds)."""
    return build.pin(plan, build.engine_resolver(docker_client, pull=False))


@pytest.mark.docker
def test_build_ngc_pytorch_on_local_base(
    docker_client: Any, base_image: str, workload: Path, built_tags: list[str]
) -> None:
    plan = build.plan_image("ngc-pytorch", {"base_image": base_image, "install_nvml": False},
                            workload_dir=workload)
    assert plan.base_image == base_image and not plan.pinned
    pinned = _pinned(docker_client, plan)
    _fresh(docker_client, pinned, built_tags)

    lines: list[str] = []
    first = build.ensure_image(plan, client=docker_client, on_log=lines.append)
    assert first.built and first.tag == pinned.tag != plan.tag
    assert any(line.startswith("Step 1/") for line in lines)
    # a locally imported base has no registry digest: its image ID pins it
    base_id = docker_client.images.get(base_image).id
    assert first.base_pin == build.BasePin(base_image, base_id, None)
    assert first.image_id == docker_client.images.get(first.tag).id

    logged = len(lines)
    second = build.ensure_image(plan, client=docker_client, on_log=lines.append)
    assert not second.built and len(lines) == logged  # no build step ran
    assert second.tag == first.tag and second.image_id == first.image_id

    image = docker_client.images.get(first.tag)
    assert image.labels[build.LABEL_HASH] == pinned.content_hash
    assert image.labels[build.LABEL_BASE] == base_image
    assert image.labels[build.LABEL_BASE_PIN] == base_id
    assert first.tag in build.local_tags(docker_client).get("ngc-pytorch", [])

    out = _run(
        docker_client,
        first.tag,
        [
            "python3",
            "-c",
            "import workload, workload.orchestrate_test_marker as m; "
            "print(list(workload.__path__)[0]); print(m.MARKER)",
        ],
    )
    assert out.split() == ["/opt/orchestrate/workload", "inside"]

    # A change in the workload gives a new tag, which is then missing: a rebuild.
    (workload / "orchestrate_test_marker.py").write_text("MARKER = 'changed'\n")
    changed = build.plan_image("ngc-pytorch", {"base_image": base_image, "install_nvml": False},
                            workload_dir=workload)
    assert changed.tag != plan.tag
    _fresh(docker_client, _pinned(docker_client, changed), built_tags)
    rebuilt = build.ensure_image(changed, client=docker_client)
    assert rebuilt.built
    assert (
        _run(
            docker_client,
            rebuilt.tag,
            ["python3", "-c", "import workload.orchestrate_test_marker as m; print(m.MARKER)"],
        ).strip()
        == "changed"
    )


@pytest.mark.docker
def test_failing_build_names_the_step(
    docker_client: Any,
    base_image: str,
    workload: Path,
    built_tags: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = tmp_path / "images"
    (root / "broken").mkdir(parents=True)
    (root / "broken" / "template.toml").write_text(
        'kind = "dockerfile"\ntemplate = "Dockerfile.j2"\nbase = "{{ base_image }}"\n'
        '[variables.base_image]\ntype = "str"\nkind = "image_ref"\ndefault = ""\n'
    )
    (root / "broken" / "Dockerfile.j2").write_text(
        "FROM {{ base }}\nRUN echo preparing\nRUN echo about to fail && exit 3\nRUN echo never\n"
    )
    monkeypatch.setattr(templates, "IMAGES_DIR", root)
    plan = build.plan_image("broken", {"base_image": base_image}, workload_dir=workload)
    _fresh(docker_client, _pinned(docker_client, plan), built_tags)
    with pytest.raises(BuildError) as err:
        build.ensure_image(plan, client=docker_client)
    message = str(err.value)
    # The engine appends the label instructions as extra steps, so the total is not fixed.
    assert re.search(r"failed at step 3/\d+: RUN echo about to fail && exit 3", message)
    assert "about to fail" in message.split("last ")[1]  # the log tail is included
    assert "returned a non-zero code: 3" in message


@pytest.mark.docker
def test_nvml_bindings_of_the_base_image_are_kept(
    docker_client: Any, base_image: str, workload: Path, built_tags: list[str], tmp_path: Path
) -> None:
    """install_nvml on (the default) over a base that can ``import pynvml``: the build keeps
    those bindings and installs nothing (no package index is reachable from a build here, so a
    pip install would fail the build). The base is the local stand-in plus a one-line pynvml
    module standing in for the bindings an NGC image may carry."""
    ctx = tmp_path / "nvml-base"
    ctx.mkdir()
    (ctx / "pynvml.py").write_text("STAND_IN = True\n")
    (ctx / "Dockerfile").write_text(
        f"FROM {base_image}\nCOPY pynvml.py /usr/local/lib/python3.11/dist-packages/pynvml.py\n")
    base_tag = "orchestrate-test/base-with-pynvml:test"
    built_tags.append(base_tag)
    docker_client.images.build(path=str(ctx), tag=base_tag, rm=True)
    plan = build.plan_image("ngc-pytorch", {"base_image": base_tag}, workload_dir=workload)
    assert "import pynvml" in plan.files["Dockerfile"].decode()
    _fresh(docker_client, _pinned(docker_client, plan), built_tags)
    outcome = build.ensure_image(plan, client=docker_client)
    assert outcome.built
    out = _run(docker_client, outcome.tag,
               ["python3", "-c", "import pynvml; print(pynvml.STAND_IN)"])
    assert out.strip() == "True"


@pytest.mark.docker
def test_bitfusion_image_on_top_of_ngc(
    docker_client: Any,
    base_image: str,
    workload: Path,
    built_tags: list[str],
    bitfusion_files: tuple[Path, Path],
) -> None:
    # bitfusion_files: a stand-in client .deb (the real client is proprietary) + a dummy CA.
    deb, cert = bitfusion_files
    values = {"base_image": base_image, "client_deb": str(deb), "ca_cert": str(cert),
              "install_nvml": False}
    plan = build.plan_image("bitfusion", values, workload_dir=workload)
    assert plan.parent is not None and plan.base_image == plan.parent.tag
    pinned = _pinned(docker_client, plan)
    # the child is rendered again FROM its pinned parent's tag: both tags cover the base's bits
    assert pinned.parent is not None and pinned.base_image == pinned.parent.tag != plan.parent.tag
    assert f"FROM {pinned.parent.tag}" in pinned.files["Dockerfile"].decode()
    _fresh(docker_client, pinned, built_tags)

    outcome = build.ensure_image(plan, client=docker_client)
    assert outcome.built and outcome.parent is not None and outcome.parent.built
    assert outcome.tag == pinned.tag and outcome.base_pin is not None
    again = build.ensure_image(plan, client=docker_client)
    assert not again.built and again.parent is not None and not again.parent.built

    out = _run(
        docker_client,
        outcome.tag,
        [
            "sh",
            "-c",
            "bitfusion run -n 1 -- python3 -c 'import workload.orchestrate_test_marker as m; "
            "print(m.MARKER)' && cat /etc/bitfusion/tls/ca.crt",
        ],
    )
    assert out.startswith("inside\n")
    assert cert.read_text().strip() in out


@pytest.mark.docker
def test_the_tag_covers_the_bits_of_the_base_not_its_name(
    docker_client: Any, base_image: str, workload: Path, built_tags: list[str], tmp_path: Path
) -> None:
    """Two bases under one name (a re-pushed or re-imported tag) give two images: the base's
    image ID (a local base has no registry digest) is in the content hash, resolved on the
    engine at build time. The second base is a thin layer on the test base (same torch)."""
    name = "orchestrate-test/moving-base:latest"
    built_tags.append(name)
    values = {"base_image": name, "install_nvml": False}
    tags = []
    for marker in ("first", "second"):
        ctx = tmp_path / marker
        ctx.mkdir()
        (ctx / "Dockerfile").write_text(f"FROM {base_image}\nENV BASE_MARKER={marker}\n")
        docker_client.images.build(path=str(ctx), tag=name, rm=True)
        plan = build.plan_image("ngc-pytorch", values, workload_dir=workload)
        pinned = _pinned(docker_client, plan)
        assert pinned.base_pin is not None
        assert pinned.base_pin.image_id == docker_client.images.get(name).id
        _fresh(docker_client, pinned, built_tags)
        outcome = build.ensure_image(plan, client=docker_client)
        assert outcome.built
        tags.append(outcome.tag)
        env = _run(docker_client, outcome.tag, ["sh", "-c", "echo $BASE_MARKER"]).strip()
        assert env == marker
    assert tags[0] != tags[1]
    # the plan (context only) is the same for both: only the pin tells them apart
    assert build.plan_image("ngc-pytorch", values, workload_dir=workload).tag == plan.tag


@pytest.mark.docker
def test_a_missing_base_is_a_build_error_naming_it(docker_client: Any, workload: Path) -> None:
    """A base that is not on the engine: a short name is never pulled (it would go to Docker
    Hub); a registry name is pulled first, and a registry that does not answer (here: nothing
    listens on localhost:1) is a BuildError naming the base and the engine."""
    local = build.plan_image("ngc-pytorch", {"base_image": "orchestrate-test/no-such-base:1"},
                             workload_dir=workload)
    with pytest.raises(BuildError, match=r"no-such-base:1 is not on this machine and it is not "
                                         r"a registry reference"):
        build.ensure_image(local, client=docker_client)
    remote = build.plan_image("ngc-pytorch", {"base_image": "localhost:1/nvidia/pytorch:24.05-py3"},
                              workload_dir=workload)
    with pytest.raises(BuildError, match=r"pulling base image localhost:1/nvidia/pytorch:24.05-py3"
                                         r" on this machine failed"):
        build.ensure_image(remote, client=docker_client)


def test_registry_digests_pin_registry_bases() -> None:
    """The digest a registry base is pinned to: the RepoDigests entry of its own repository
    (unverified against a real registry here: there is none on these machines)."""
    digests = ["nvcr.io/nvidia/pytorch@sha256:" + "a" * 64,
               "mirror.lab:5000/nvidia/pytorch@sha256:" + "b" * 64]
    assert build._repo_digest("nvcr.io/nvidia/pytorch:24.05-py3", digests) == digests[0]
    assert build._repo_digest("mirror.lab:5000/nvidia/pytorch:24.05-py3", digests) == digests[1]
    assert build._repo_digest("other/pytorch:24.05-py3", digests) is None
    assert build._repo_digest("orchestrate-test/base:1", []) is None
    pinned = "nvcr.io/nvidia/pytorch:24.05-py3@sha256:" + "c" * 64
    assert build._repo_digest(pinned, []) == "nvcr.io/nvidia/pytorch@sha256:" + "c" * 64
    assert build.split_ref("registry:5000/a/b:1") == ("registry:5000/a/b", "1", None)
    assert build.split_ref("registry:5000/a/b") == ("registry:5000/a/b", None, None)
    assert build.registry_ref("nvcr.io/nvidia/pytorch:24.05-py3")
    assert build.registry_ref("localhost:5000/x:1") and build.registry_ref("localhost/x")
    assert not build.registry_ref("orchestrate-test/base:1") and not build.registry_ref("ubuntu")


def test_pinning_changes_the_tag_and_keeps_the_context(workload: Path) -> None:
    plan = build.plan_image("ngc-pytorch", {}, workload_dir=workload)
    a = build.pin(plan, lambda ref: build.BasePin(ref, "sha256:" + "1" * 64))
    b = build.pin(plan, lambda ref: build.BasePin(ref, "sha256:" + "2" * 64))
    digest = build.pin(plan, lambda ref: build.BasePin(ref, "sha256:" + "1" * 64,
                                                       "nvcr.io/nvidia/pytorch@sha256:" + "9" * 64))
    assert len({plan.tag, a.tag, b.tag, digest.tag}) == 4
    assert a.files == plan.files and a.pinned and not plan.pinned
    assert build.pin(a, lambda ref: pytest.fail("a pinned plan is not resolved again")) is a


def test_file_variables_hash_by_content_not_host_path(
    workload: Path, bitfusion_stub_files: dict[str, str], tmp_path: Path
) -> None:
    plan = build.plan_image("bitfusion", bitfusion_stub_files, workload_dir=workload)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    moved = {}
    for key, path in bitfusion_stub_files.items():
        moved[key] = str(shutil.copy(path, elsewhere / Path(path).name))
    assert build.plan_image("bitfusion", moved, workload_dir=workload).tag == plan.tag
