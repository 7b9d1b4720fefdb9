"""The recipe "An image template" of docs/contributing.md, done: a toy template written by its
steps, in an images folder of the test's own, loads, renders, carries ``workload/`` into its
build context and refuses a value that would add a line or run a command; the checks the recipe
relies on notice it (``CASES`` in tests/test_images.py, the page that names every template).
Nothing is built (the build is tests/test_build.py's).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import test_images

from orchestrator.catalog import templates
from orchestrator.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]

#: Step 1: template.toml (description, kind, template file, base, typed variables with kinds).
MANIFEST = '''\
description = "A toy image: a Debian base, a few packages and the workload"
kind = "dockerfile"
template = "Dockerfile.j2"
base = "{{ base_image }}"

[variables.base_image]
type = "str"
kind = "image_ref"
default = "debian:bookworm"
description = "the FROM image"

[variables.apt_packages]
type = "list"
kind = "apt_package"
default = ["ca-certificates"]
description = "Debian packages to install"

[variables.motd]
type = "str"
kind = "text"
default = "hello"
description = "a line the image keeps in /etc/motd"
'''
#: Step 2: the template: copies workload/ in, every value into a shell line through shquote.
DOCKERFILE = '''\
FROM {{ base }}
RUN apt-get update && apt-get install -y {{ apt_packages | map("shquote") | join(" ") }}
RUN echo {{ motd | shquote }} > /etc/motd
COPY workload/ /opt/orchestrate/workload/
WORKDIR /opt/orchestrate
CMD ["python3", "-m", "workload"]
'''
#: Step 3: its defaults and overrides, as CASES in tests/test_images.py holds them.
TOY_CASES = {"defaults": {}, "overrides": {
    "base_image": "registry.lab:5000/debian:bookworm", "apt_packages": ["curl", "git"],
    "motd": "it's a 'toy' image"}}


@pytest.fixture
def images(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An images folder holding the toy template only (steps 1 and 2)."""
    folder = tmp_path / "images" / "toy"
    folder.mkdir(parents=True)
    (folder / "template.toml").write_text(MANIFEST, encoding="utf-8")
    (folder / "Dockerfile.j2").write_text(DOCKERFILE, encoding="utf-8")
    monkeypatch.setattr(templates, "IMAGES_DIR", folder.parent)
    return folder.parent


def render(values: dict[str, object]) -> str:
    template = templates.load_template("toy")
    return template.render(template.resolve(values))


def test_the_toy_template_renders_its_defaults_and_overrides(images: Path) -> None:
    assert templates.template_names() == ["toy"]
    defaults = render(TOY_CASES["defaults"])
    assert defaults.startswith("FROM debian:bookworm\n")
    assert "apt-get install -y ca-certificates\n" in defaults
    overrides = render(TOY_CASES["overrides"])
    assert overrides.startswith("FROM registry.lab:5000/debian:bookworm\n")
    assert "apt-get install -y curl git\n" in overrides
    motd = TOY_CASES["overrides"]["motd"]
    assert f"RUN echo {shlex.quote(str(motd))} > /etc/motd\n" in overrides
    assert shlex.split(re.search(r"RUN echo (.*) >", overrides)[1]) == [motd]  # type: ignore[index]


def test_its_build_context_holds_the_workload(images: Path) -> None:
    template = templates.load_template("toy")
    files = template.files(template.resolve({}))
    assert "Dockerfile" in files
    assert "workload/__main__.py" in files
    assert files["workload/__main__.py"] == (ROOT / "workload" / "__main__.py").read_bytes()


@pytest.mark.parametrize(("name", "value"), [
    ("motd", "line\nRUN rm -rf /"),  # a new Dockerfile line
    ("apt_packages", ["curl; rm -rf /"]),  # a second command
    ("apt_packages", ["--allow-unauthenticated"]),  # an option of apt-get
    ("base_image", "debian:bookworm\nRUN id"),
])
def test_a_value_that_would_add_a_line_or_run_a_command_is_refused(
    images: Path, name: str, value: object
) -> None:
    with pytest.raises(ConfigError) as err:
        render({name: value})
    assert name in str(err.value)


def test_the_golden_cases_check_notices_a_template_without_cases(
    images: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step 3's guard: tests/test_images.py's check fails for the toy template until its cases
    are in CASES, then passes."""
    with pytest.raises(AssertionError):
        test_images.test_every_template_has_golden_cases()
    monkeypatch.setattr(test_images, "CASES", {"toy": TOY_CASES})
    test_images.test_every_template_has_golden_cases()


def test_every_template_is_named_on_the_images_page() -> None:
    """Step 4, for the shipped templates: docs/images.md names each one."""
    page = (ROOT / "docs" / "images.md").read_text(encoding="utf-8")
    missing = [name for name in templates.template_names() if f"`{name}`" not in page]
    assert not missing, f"docs/images.md does not name the templates {missing}"
