"""Render every answer combination the template offers and check the rendered project.

One render per combination (module-scoped fixture); the checks share it, and the last one
runs the rendered project's own test suite. To cover a new data source, add its answers to
SOURCES (test_every_offered_choice_is_rendered fails until a new choice is listed here).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import json
import re
import runpy
import subprocess
import sys
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import (
    COPIER_YML,
    RENDERED_TESTS_TIMEOUT_S,
    REPO,
    copier_questions,
    copy_template_repo,
    git,
    leftover_jinja,
    project_env,
    render,
    rendered_files,
    run,
    tail,
)
from slurm import unavailable as slurm_unavailable

# The data sources rendered, as the answers that select each one (one entry per backend).
SOURCES: list[dict[str, Any]] = [
    {"data_source": "folder"},
    {"data_source": "stream", "stream_backend": "sqlite"},
    {"data_source": "stream", "stream_backend": "http"},
    {"data_source": "shards"},
    {"data_source": "parquet"},
]
FORMATS = ["image", "tensor", "sequence"]
# "GPU answers": a CPU-only single machine, and 2 nodes x 2 GPUs (renders the SLURM script).
HARDWARE = [{"num_gpus": 0, "num_nodes": 1}, {"num_gpus": 2, "num_nodes": 2}]
BATCH_SIZE = 16  # not the default 32, so a default cannot pass for the answer
# The rendered tests of what handles a format's samples (with the source's own test file): what
# the tensor and sequence projects run (test_rendered_project_tests_pass).
FORMAT_FILES = [
    "test_sources.py",
    "test_task.py",
    "test_model.py",
    "test_sample_data.py",
    "test_cache.py",
    "test_loader.py",
    "test_train.py",
    "test_checks.py",
]
# Where they run: a source carries a sample's bytes by the task's file extensions, and the format's
# code (task, model, synthetic data) is the same on every source; each format runs on the folder
# source (map-style) and on one iterable source, and each iterable source's image project runs it all.
FORMAT_SOURCES = {"tensor": {"folder", "sqlite"}, "sequence": {"folder", "shards"}}
# What a Parquet project runs: its own reading of each format's column (a list of numbers, a string)
# and the sources' contract, DDP in lockstep (its split by row group), and the CLI; the rest of the
# iterable source (iterable.py) runs in the SQLite and shards projects.
PARQUET_OWN = ["test_parquet.py", "test_sources.py", "test_bench.py::test_cli_sample_data_bench_train"]
# What the shards image project runs: its own reading (tar shards from a folder, HTTP or a bucket), the
# sources' contract, DDP in lockstep and equal steps (its split by shard), a mix with a stream, the
# launcher's faults it hosts (test_rendered_project_tests_pass) and the CLI; the rest of the iterable
# source (iterable.py: epochs, resume, batches, bad rows) runs over SQLite, whose project runs it all.
SHARDS_OWN = [
    "test_shards.py",
    "test_s3.py",
    "test_sources.py",
    "test_launch.py",
    "test_mix_stream.py",
    "test_sample_data.py",
    "test_bench.py::test_cli_sample_data_bench_train",
]


def _combinations() -> list:
    params = []
    for source, data_format, hardware in product(SOURCES, FORMATS, HARDWARE):
        name = "-".join([*map(str, source.values()), data_format, f"{hardware['num_nodes']}x{hardware['num_gpus']}gpu"])
        answers = {
            "project_name": f"Feed {name}",
            **source,
            "data_format": data_format,
            **hardware,
            "batch_size": BATCH_SIZE,
        }
        params.append(pytest.param(answers, id=name))
    return params


COMBINATIONS = _combinations()


@dataclass
class Rendered:
    path: Path
    answers: dict[str, Any]  # every answer asked, the derived package_name included
    files: dict[str, bytes]  # what copier wrote, read right after the render

    @property
    def package(self) -> str:
        return self.answers["package_name"]


@pytest.fixture(scope="module", params=COMBINATIONS)
def project(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    dst = tmp_path_factory.mktemp("render") / "project"
    worker = render(dst, **request.param)
    questions = copier_questions()
    # the answers asked (a question whose `when` is false, e.g. stream_backend for a folder, is not)
    answers = {k: v for k, v in worker.answers.combined.items() if k in questions and k not in worker.answers.hidden}
    return Rendered(dst, answers, rendered_files(dst))


# ---------------------------------------------------------------------------------------------
# The list of combinations itself
# ---------------------------------------------------------------------------------------------


def test_every_offered_choice_is_rendered() -> None:
    """Each choice of each multiple-choice question in copier.yml appears in some combination."""
    rendered = [p.values[0] for p in COMBINATIONS]
    for name, question in copier_questions().items():
        choices = question.get("choices")
        if not choices:
            continue
        offered = set(choices.values()) if isinstance(choices, dict) else set(choices)
        covered = {answers[name] for answers in rendered if name in answers}
        assert offered <= covered, f"{name}: choices {sorted(offered - covered)} are never rendered by test_render"


# ---------------------------------------------------------------------------------------------
# Per combination (in this order: the last one runs code in the project)
# ---------------------------------------------------------------------------------------------


def test_derived_package_name(project: Rendered) -> None:
    expected = re.sub(r"[^a-z0-9_]+", "_", project.answers["project_name"].lower()).strip("_")
    assert project.package == expected
    assert f"src/{expected}/__init__.py" in project.files


def test_no_leftover_jinja(project: Rendered) -> None:
    assert project.files, "nothing was rendered"
    problems = leftover_jinja(project.files)
    assert not problems, "Jinja left in the rendered project:\n" + "\n".join(problems)


def test_ruff_check(project: Rendered) -> None:
    result = run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], project.path)
    assert result.returncode == 0, f"ruff check failed:\n{tail(result.stdout)}"


def test_ruff_format(project: Rendered) -> None:
    result = run([sys.executable, "-m", "ruff", "format", "--check", "--no-cache", "."], project.path)
    assert result.returncode == 0, f"ruff format --check failed:\n{tail(result.stdout)}"


def test_gpu_smoke_script_only_with_gpus(project: Rendered) -> None:
    script = project.path / "scripts" / "gpu_smoke.sh"
    if project.answers["num_gpus"] == 0:
        assert not script.exists(), "scripts/gpu_smoke.sh rendered without GPUs"
        if project.answers["num_nodes"] == 1:
            assert not (project.path / "scripts").exists(), "an empty scripts/ folder"
        return
    text = script.read_text(encoding="utf-8")
    assert f"python -m {project.package} launch" not in text and "run launch --nproc-per-node" in text
    assert 'set_sync_debug_mode("warn")' in text
    syntax = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert syntax.returncode == 0, f"scripts/gpu_smoke.sh is not valid bash:\n{syntax.stderr}"


def test_the_gpu_smokes_throughput_script_runs_on_the_cpu(project: Rendered, tmp_path: Path) -> None:
    """scripts/gpu_smoke.sh's throughput measurement (every path, resnet18, the capacity verdict), tiny, on
    the CPU: the script a GPU machine runs must not rot where no GPU is."""
    answers = project.answers
    if answers["num_gpus"] == 0 or answers["data_format"] != "image" or answers["data_source"] != "folder":
        pytest.skip("the script renders for GPU answers; its Python is the same for every source: one image project")
    text = (project.path / "scripts" / "gpu_smoke.sh").read_text(encoding="utf-8")
    script = re.search(r"^cat > \"\$out/throughput\.py\" <<'PY'[^\n]*\n(.*?)^PY$", text, re.MULTILINE | re.DOTALL)
    assert script, "gpu_smoke.sh writes no throughput.py"
    (tmp_path / "throughput.py").write_text(script[1], encoding="utf-8")
    tiny = [
        "--images",
        "60",
        "--workers",
        "1",
        "--batch-size",
        "4",
        "--batches",
        "2",
        "--warmup",
        "1",
        "--device",
        "cpu",
    ]
    result = run(
        [sys.executable, str(tmp_path / "throughput.py"), str(tmp_path / "out"), *tiny],
        project.path,
        env=project_env(project.path),
        timeout=600,
    )
    assert result.returncode == 0, tail(result.stdout)
    rows = [line.split()[:2] for line in result.stdout.splitlines() if re.match(r"(source|cache) ", line)]
    assert rows == [["source", "workers"], ["cache", "workers"], ["cache", "device"], ["source", "device"]], rows
    assert "resnet18 consumes" in result.stdout and "loader CPU" in result.stdout, tail(result.stdout)


def test_slurm_script_only_for_several_nodes(project: Rendered) -> None:
    script = project.path / "scripts" / "slurm.sbatch"
    if project.answers["num_nodes"] == 1:
        assert not script.exists(), "scripts/slurm.sbatch rendered for a single node"
        return
    assert script.is_file(), "scripts/slurm.sbatch missing for num_nodes > 1"
    text = script.read_text(encoding="utf-8")
    assert f"#SBATCH --nodes={project.answers['num_nodes']}" in text
    gpus = project.answers["num_gpus"]
    assert (f"#SBATCH --gpus-per-node={gpus}" in text) == (gpus > 0)
    assert f"--nproc-per-node {gpus or 1}" in text  # one process per GPU, one on a CPU-only node
    assert f"python -m {project.package} launch" in text
    syntax = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert syntax.returncode == 0, f"scripts/slurm.sbatch is not valid bash:\n{syntax.stderr}"


def test_answers_file(project: Rendered) -> None:
    saved = yaml.safe_load(project.files[".copier-answers.yml"])
    assert saved["_src_path"], "no _src_path: copier update would not find the template"
    assert saved["_commit"], "no _commit: copier update would not know the template version"
    assert {k: saved.get(k) for k in project.answers} == project.answers


# The user's files (copier.yml's _skip_if_exists; the rendered README's "Which files are yours").
USER_FILES = ("src/{package}/model.py", "src/{package}/task.py", "src/{package}/sources.py", "configs/default.yaml")
YOURS = "# Yours: `copier update` never rewrites this file."
THE_TEMPLATES = "torchfeed's file: `copier update` replaces it"


def test_every_file_says_whose_it_is_and_the_readme_lists_the_users(project: Rendered) -> None:
    """A user's file opens with ``# Yours``; every other file copier writes (the answers aside) says it
    is the template's in its first lines, and copier.yml skips exactly the user's on update."""
    users = {rel.format(package=project.package) for rel in USER_FILES}
    unmarked = []
    for rel, content in project.files.items():
        head = "\n".join(content.decode("utf-8", errors="replace").splitlines()[:3])
        if rel == ".copier-answers.yml":
            continue
        if (YOURS in head) != (rel in users) or (rel not in users and THE_TEMPLATES not in head):
            unmarked.append(rel)
    assert not unmarked, f"files whose first lines do not say whose they are: {unmarked}"
    skipped = yaml.safe_load(COPIER_YML.read_text(encoding="utf-8"))["_skip_if_exists"]
    assert len(skipped) == len(USER_FILES) and all(
        rel.format(package="{{ package_name }}") in pattern for rel, pattern in zip(USER_FILES, skipped)
    ), f"copier.yml's _skip_if_exists is not the user's files: {skipped}"
    readme = project.files["README.md"].decode("utf-8").split("## Which files are yours", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([^`]+)` \|", readme, flags=re.MULTILINE))
    assert listed == users, f"the README's table of the user's files says {sorted(listed)}"
    assert yaml.safe_load(project.files[".copier-answers.yml"])["torchfeed_ownership"] == 2


def test_project_module_holds_only_what_runs_at_run_time(project: Rendered) -> None:
    module = runpy.run_path(str(project.path / "src" / project.package / "project.py"))
    constants = {k: v for k, v in module.items() if k.isupper()}
    assert constants == {
        "PACKAGE": project.package,
        "NUM_GPUS": project.answers["num_gpus"],
        "NUM_NODES": project.answers["num_nodes"],
        "BATCH_SIZE": project.answers["batch_size"],
    }


# Names that only the code of one answer uses: (question, the answers that may use them, patterns);
# "source" is the data source with the stream's backend in its place (folder, sqlite, http, shards, parquet).
VARIANT_MARKERS = [
    ("data_source", {"stream"}, [r"sqlite", r"samples_per_epoch", r"database"]),
    ("stream_backend", {"http"}, [r"base64"]),
    ("source", {"http", "shards", "parquet"}, [r"\bhttp"]),  # shards may be read from http(s) URLs; S3 endpoints
    ("data_source", {"shards"}, [r"shard", r"webdataset", r"\.tar\b", r"_index\.json"]),
    ("data_source", {"shards", "parquet"}, [r"boto3", r"moto", r"s3\.py"]),
    ("data_source", {"stream", "shards", "parquet"}, [r"IterableSource", r"shuffle_buffer", r"block_sizes"]),
    ("data_source", {"parquet"}, [r"parquet", r"pyarrow", r"row.group"]),
    ("data_source", {"folder"}, [r"FolderSource"]),
    ("data_source", {"folder", "shards", "parquet"}, [r"FolderIndex", r"scan_classes", r"class_name"]),
    ("data_format", {"image"}, [r"image_size", r"jpe?g", r"RandomResizedCrop", r"\bcv2\b"]),
    ("data_format", {"tensor"}, [r"(?<![a-z])\.npy", r"allow_pickle"]),  # not a cache's index.npy
    ("data_format", {"sequence"}, [r"max_len", r"\btokens?\b", r"utf-8 text"]),
]
EXPECTED_DATA_MODULES = {
    "folder": {"folder.py", "folder_index.py"},
    "sqlite": {"sqlite.py", "database.py", "iterable.py", "mix_stream.py"},
    "http": {"http.py", "database.py", "serve.py", "iterable.py", "mix_stream.py"},
    "shards": {"shards.py", "shard_reader.py", "s3.py", "folder_index.py", "iterable.py", "mix_stream.py"},
    "parquet": {"parquet.py", "s3.py", "folder_index.py", "iterable.py", "mix_stream.py"},
}
COMMON_DATA_MODULES = {
    "__init__.py",
    "project_source.py",  # one per source, by its file name's condition
    "sample.py",
    "mix.py",
    "source.py",
    "loader.py",
    "settings.py",
    "batch_pool.py",
    "synthetic.py",
    "marker.py",
    "cache.py",
    "cache_writer.py",
    "pack.py",
}


# Names that only a project with GPUs uses (where the crop and decode of images may run on the device).
GPU_MARKERS = [r"augment_on", r"decode_on", r"torchcodec", r"roi_align", r"device_path"]


def test_only_the_chosen_code_is_rendered(project: Rendered) -> None:
    """src/ and configs/ hold no code and no config key of the answers not chosen."""
    source = project.answers.get("stream_backend") or project.answers["data_source"]
    modules = {rel.rsplit("/", 1)[1] for rel in project.files if rel.startswith(f"src/{project.package}/data/")}
    assert modules == EXPECTED_DATA_MODULES[source] | COMMON_DATA_MODULES
    problems = []
    for question, allowed, patterns in VARIANT_MARKERS:
        if (source if question == "source" else project.answers.get(question)) in allowed:
            continue
        for rel, content in project.files.items():
            if rel.startswith(("src/", "configs/")):
                text = content.decode("utf-8")
                problems += [
                    f"{rel}: {p!r} ({question} is not one of {sorted(allowed)})"
                    for p in patterns
                    if re.search(p, text, re.I)
                ]
    if project.answers["num_gpus"] == 0 or project.answers["data_format"] != "image":
        for rel, content in project.files.items():
            if rel.startswith(("src/", "configs/", "pyproject.toml")):
                text = content.decode("utf-8")
                problems += [f"{rel}: {p!r} (a project without GPUs)" for p in GPU_MARKERS if re.search(p, text)]
    assert not problems, "code of answers not chosen:\n" + "\n".join(problems)


# ---------------------------------------------------------------------------------------------
# The public API of torch, torchdata and torchvision
# ---------------------------------------------------------------------------------------------

# The libraries whose public API the default path keeps to, and the one module allowed beyond it.
LIBRARIES = ("torch", "torchdata", "torchvision")
BEYOND_THE_PUBLIC_API = "data/batch_pool.py"
# Python's own names that begin with an underscore and are public (os._exit, a namedtuple's methods).
PUBLIC_UNDERSCORED = {"_exit", "_getframe", "_replace", "_asdict", "_fields", "_make"}
# What a module that parses torch's messages, or swaps its signal handlers, would say.
TORCH_MESSAGES = (
    "DataLoader worker (pid",
    "exited unexpectedly",
    "is killed by signal",
    "DataLoader timed out",
    "unable to allocate shared memory",
    "in DataLoader worker process",
)


def private_api_uses(source: str) -> list[str]:
    """Each use of a private part of torch, torchdata or torchvision in a module's ``source``, as a line.

    An import of a module or name of theirs that begins with an underscore; an attribute of theirs
    so named (``torch._C``, ``x._cdata``: an underscored attribute the module never defines itself);
    a change of the SIGCHLD handler torch sets; a literal that quotes one of torch's messages.

    >>> private_api_uses("import torch\\nn = torch._C._storage_Use_Count(s._cdata)")
    ['line 2: torch._C._storage_Use_Count', 'line 2: ._cdata', 'line 2: torch._C']
    >>> private_api_uses("class A:\\n    def f(self):\\n        self._x = os._exit")
    []
    """
    tree = ast.parse(source)
    docstrings = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and n.body
        and isinstance(n.body[0], ast.Expr)
    }
    own = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    own |= {
        t.attr
        for n in ast.walk(tree)
        if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign))
        for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
        if isinstance(t, ast.Attribute)
    }
    own |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    own |= {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments) for a in n.args + n.kwonlyargs}
    uses = []

    def private(name: str) -> bool:
        return name.startswith("_") and not name.startswith("__") and name not in PUBLIC_UNDERSCORED

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in LIBRARIES:
            parts = [*node.module.split("."), *(a.name for a in node.names)]
            uses += [
                f"line {node.lineno}: from {node.module} import {a.name}"
                for a in node.names
                if any(map(private, parts))
            ]
        elif isinstance(node, ast.Import):
            uses += [
                f"line {node.lineno}: import {a.name}"
                for a in node.names
                if a.name.split(".")[0] in LIBRARIES and any(map(private, a.name.split(".")))
            ]
        elif isinstance(node, ast.Attribute) and private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in LIBRARIES:
                uses.append(f"line {node.lineno}: {ast.unparse(node)}")
            elif node.attr not in own:
                uses.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("signal.signal", "getattr", "hasattr"):
            text = ast.unparse(node)
            if "SIGCHLD" in text or any(
                isinstance(a, ast.Constant) and isinstance(a.value, str) and private(a.value) and a.value not in own
                for a in node.args[1:2]
            ):
                uses.append(f"line {node.lineno}: {text}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            uses += [f"line {node.lineno}: quotes {m!r}" for m in TORCH_MESSAGES if m in node.value]
    return uses


def test_the_data_path_keeps_to_the_public_api_but_in_one_module(project: Rendered) -> None:
    """Every use of a private part of torch, torchdata or torchvision in the project's code, listed: none
    outside data/batch_pool.py (the mechanism ``loader.batch_pool`` switches on where bench measured it
    faster), whose own uses the scan finds (it finds what it looks for)."""
    found = {}
    for rel, content in project.files.items():
        code = rel.startswith(f"src/{project.package}/") and rel.endswith(".py")
        if code and (uses := private_api_uses(content.decode("utf-8"))):
            found[rel.removeprefix(f"src/{project.package}/")] = uses
    outside = {rel: uses for rel, uses in found.items() if rel != BEYOND_THE_PUBLIC_API}
    assert not outside, (
        "private parts of torch, torchdata or torchvision used outside data/batch_pool.py:\n"
        + "\n".join(f"{rel}: {use}" for rel, uses in outside.items() for use in uses)
    )
    assert BEYOND_THE_PUBLIC_API in found, "the scan finds none of batch_pool.py's own uses"


def test_the_seed_config_sets_a_few_keys_to_their_defaults(project: Rendered) -> None:
    """configs/default.yaml is the user's: it starts with the keys a user sets first, at their defaults,
    so a later release's new default is not pinned in it (``config`` prints every key)."""
    tree = yaml.safe_load(project.files["configs/default.yaml"])
    in_yaml = {f"{s}.{k}": v for s, keys in tree.items() for k, v in (keys or {}).items()}
    assert {"data.root", "train.epochs"} <= set(in_yaml) and len(in_yaml) <= 4, sorted(in_yaml)
    truth = dataclass_defaults(project)
    assert {k: truth.get(k) for k in in_yaml} == in_yaml, "the seed config differs from the dataclasses' defaults"


def test_the_config_command_prints_every_key_with_its_value_and_meaning(project: Rendered) -> None:
    config = import_rendered(project, "config")
    cfg = config.Config()
    rows = config.describe(cfg)
    truth = dataclass_defaults(project)
    assert [f"{s}.{k}" for s, k, _, _ in rows] == list(truth), "config does not print every key in order"
    assert not [f"{s}.{k}" for s, k, _, meaning in rows if not meaning], "keys without a comment above their field"
    tree = yaml.safe_load(config.as_yaml(cfg))
    assert {f"{s}.{k}": v for s, keys in tree.items() for k, v in keys.items()} == truth
    table = config.as_markdown(cfg)
    assert len(re.findall(r"^\| `[a-z_]+\.[a-z0-9_]+` \| `", table, flags=re.MULTILINE)) == len(truth)


# What reading the config may import of the project: the config's own modules and the seams it reads
# keys from (model.py's ModelConfig, sources.py's SourceKeys), and no data code.
CONFIG_IMPORTS = {"", "config", "data", "data.project_source", "errors", "format_config", "model", "project", "sources"}


def test_the_config_is_a_leaf_that_imports_no_data_code(project: Rendered) -> None:
    """``import <package>.config`` imports none of the sources, the loader, the cache or the format's
    decoding (torchdata, PIL, torchvision, psutil): the data path runs one way, from the config down."""
    if project.answers["num_gpus"] > 0:
        pytest.skip("the same Python as the CPU answers' (project.py's numbers aside)")
    probe = f"import json, sys; import {project.package}.config; print(json.dumps(sorted(sys.modules)))"
    result = run([sys.executable, "-c", probe], project.path, env=project_env(project.path))
    assert result.returncode == 0, tail(result.stdout)
    modules = json.loads(result.stdout.splitlines()[-1])
    ours = {m.removeprefix(project.package).lstrip(".") for m in modules if m.split(".")[0] == project.package}
    assert ours == CONFIG_IMPORTS, f"the config imports {sorted(ours - CONFIG_IMPORTS)} of the project"
    heavy = sorted(m for m in ("torchdata", "PIL", "torchvision", "psutil", "webdataset") if m in modules)
    assert not heavy, f"the config imports {heavy}"


def import_rendered(project: Rendered, module: str):
    """A module of the rendered package, imported in this process (its package has a name of its own)."""
    sys.path.insert(0, str(project.path / "src"))
    try:
        imported = importlib.import_module(f"{project.package}.{module}")
    finally:
        sys.path.remove(str(project.path / "src"))
    assert Path(imported.__file__).is_relative_to(project.path), f"{project.package} imported from elsewhere"
    return imported


def dataclass_defaults(project: Rendered) -> dict[str, object]:
    """``section.key`` -> default, read from the rendered project's config dataclasses.

    Imported in this process (each combination's package has a name of its own): a process per
    render would import torch again each time.
    """
    cfg = import_rendered(project, "config").Config()
    sections = [(s.name, getattr(cfg, s.name)) for s in dataclasses.fields(cfg)]
    return {f"{n}.{f.name}": getattr(c, f.name) for n, c in sections for f in dataclasses.fields(c)}


def readme_defaults(text: str) -> dict[str, object]:
    """A table of keys and defaults in the README: ``section.key`` -> its default cell, read as YAML."""
    rows = re.findall(r"^\| `([a-z_]+\.[a-z0-9_]+)` \| `([^`]*)` \|", text, flags=re.MULTILINE)
    return {key: yaml.safe_load(cell) for key, cell in rows}


def mismatches(truth: dict[str, object], yaml_text: str, readme_text: str) -> list[str]:
    """Every key whose default the seed config gives otherwise than the dataclasses, and every default
    the README repeats (the ``config`` command prints them: a copy by hand would go stale)."""
    tree = yaml.safe_load(yaml_text)
    in_yaml = {f"{s}.{k}": v for s, keys in tree.items() for k, v in (keys or {}).items()}
    problems = []
    for key, value in sorted(in_yaml.items()):
        if key not in truth:
            problems.append(f"{key}: in configs/default.yaml but not a config key")
        elif value != truth[key] or type(value) is not type(truth[key]):
            problems.append(f"{key}: configs/default.yaml says {value!r}, the dataclass {truth[key]!r}")
    problems += [f"{key}: README.md repeats its default by hand" for key in sorted(readme_defaults(readme_text))]
    return problems


def test_defaults_live_in_the_dataclasses_alone(project: Rendered) -> None:
    """The dataclasses hold the defaults; the seed config sets a few of them, the README none (``config``
    prints them all, the user's own keys too)."""
    yaml_text, readme = project.files["configs/default.yaml"].decode(), project.files["README.md"].decode()
    truth = dataclass_defaults(project)
    assert mismatches(truth, yaml_text, readme) == []
    assert f"python -m {project.package} config --markdown" in readme
    # The check names what differs: an edited copy of each file.
    edited = re.sub(r"^(  epochs:) \d+", r"\1 7", yaml_text, count=1, flags=re.MULTILINE)
    assert mismatches(truth, edited, readme) == ["train.epochs: configs/default.yaml says 7, the dataclass 3"]
    table = "| key | default |\n| --- | --- |\n| `optim.lr` | `0.003` |\n"
    assert mismatches(truth, yaml_text, readme + table) == ["optim.lr: README.md repeats its default by hand"]


def test_pyproject(project: Rendered) -> None:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    pyproject = tomllib.loads(project.files["pyproject.toml"].decode("utf-8"))
    assert pyproject["project"]["scripts"] == {project.package: f"{project.package}.__main__:main"}
    assert pyproject["project"]["name"] == project.package.replace("_", "-")
    # torch 2.5: barrier() uses the device bound to the process group (2.4 guesses one, and can hang)
    assert "torch>=2.5" in pyproject["project"]["dependencies"]
    # the lower bounds are the versions scripts/compat.sh runs the fast suite on ("oldest")
    oldest = re.search(r'"oldest\|([^"]+)"', (REPO / "scripts" / "compat.sh").read_text(encoding="utf-8"))[1]
    for pin in oldest.split():
        name, version = pin.split("==")
        bound = ".".join(version.split(".")[:2])
        assert f"{name}>={bound}" in pyproject["project"]["dependencies"], (pin, pyproject["project"]["dependencies"])


def test_a_container_recipe_users_can_copy(project: Rendered) -> None:
    """The Dockerfile installs this package and runs its CLI; the README's `docker run` gives /dev/shm room
    (and the GPUs with GPU answers); its table maps what a container's user sees to the cause and the fix."""
    dockerfile = project.files["Dockerfile"].decode("utf-8")
    steps = [line.split(None, 1) for line in dockerfile.splitlines() if line and not line.startswith("#")]
    assert steps[0][0] == "FROM" and steps[-1] == ["CMD", '["train"]'], steps
    assert ["ENTRYPOINT", f'["python", "-m", "{project.package}"]'] in steps
    for copied in (words.split()[:-1] for op, words in steps if op == "COPY"):
        assert all(name in project.files or any(f.startswith(name + "/") for f in project.files) for name in copied)
    index = next(words for op, words in steps if op == "ARG" and words.startswith("TORCH_INDEX="))
    assert ("whl/cpu" in index) == (project.answers["num_gpus"] == 0), index
    ignored = project.files[".dockerignore"].decode("utf-8").split()
    assert {"data", "runs", ".git", ".venv"} <= set(ignored)
    readme = project.files["README.md"].decode("utf-8")
    runs = [line for line in readme.splitlines() if line.startswith("docker run")]
    assert any("--shm-size=" in line for line in runs) and any("--ipc=host" in line for line in runs), runs
    assert all(("--gpus all" in line) == (project.answers["num_gpus"] > 0) for line in runs), runs
    assert "emptyDir: {medium: Memory" in readme and "mountPath: /dev/shm" in readme
    table = readme.split("## When something goes wrong", 1)[1].split("\n## ", 1)[0]
    for symptom in ("Bus error", "No space left on device", "killed by SIGKILL", "sent no batch", "waits for data"):
        assert any(row.startswith("| ") and symptom in row.split(" | ")[0] for row in table.splitlines()), symptom
    assert f"{project.package.upper()}_START_METHOD=spawn" in readme and "loader.start_method=spawn" in readme


@pytest.mark.slow
@pytest.mark.timeout(RENDERED_TESTS_TIMEOUT_S + 60)
def test_rendered_project_tests_pass(project: Rendered) -> None:
    """The project's own suite, its slow tests (DDP, several processes) included, with the CPU answers.

    What each project runs is what can differ in it:

    - The faults under `launch` (kill -9 and restart, SIGTERM, a stopped rank, two nodes, 100
      epochs) do not depend on the format, and but for the restart's resume not on the source:
      they run once, spread over the folder and shards image projects (the kill -9 restart:
      below). Where a real Slurm runs here, test_slurm.py kills a rank on either of two nodes under it, and the
      folder project leaves out its own two-node kill -9 (the same launcher, without Slurm).
    - DDP in lockstep and equal steps per rank depend on the source's sharding, not on the
      format: the image project of each source runs them. The tensor and sequence projects run
      the fast tests of what reads, decodes, batches, caches, trains and resumes samples of the
      format (FORMAT_FILES and the source's own file, and the CLI's sample-data, bench, train);
      the launcher, bench's measurements and the config do not depend on the format. A source
      carries a sample's bytes by the task's file extensions, so each format runs on the folder
      source and on one iterable source (FORMAT_SOURCES).
    - The kill -9 restart resumes the source from its checkpoint, as the fast suite's crash and
      resume tests do in one process for every source and format: it runs on the folder image
      project. An iterable source (iterable.py: SQLite, HTTP, the shards) killed under torchrun
      resumes, as an entry of a mix, in the shards project (mix_stream.py's kill -9 of a mix with a
      stream among its entries), and test_s3's kill -9 mid-download resumes to the same samples and weights.
    - The Parquet source reads through the iterable source too: its projects run what is their own
      (PARQUET_OWN: each format's column, the sources' contract, the CLI; in the image project DDP
      in lockstep and equal steps, its split by row group being its own, and the files from a
      bucket, test_parquet_s3.py, whose reads do not depend on the format).
    - The two streamed sources and the shards share the iterable source (iterable.py: epochs, resume,
      batches, bad rows) and everything above it: the SQLite project runs the whole suite over it;
      the shards project runs what is its own (SHARDS_OWN); the HTTP project too: test_http.py, the
      sources' contract (every sample once per epoch over ranks and workers, equal planned steps,
      resume from a loader's state, nothing left open, the cache), DDP in lockstep and equal steps
      (its sharding by id is its own), and the CLI.
    - A mix with a stream among its entries (mix_stream.py) is the same code in the three projects
      that stream: the SQLite and shards image projects run its tests, its kill -9 under torchrun on
      shards only.
    - Tests marked `common` (the cache writer, checkpoint files, CLI errors, worker start
      methods, the image crops' own behaviour) depend on neither: they run in the folder image
      project only.
    - The GPU answers render the same Python but for project.py's numbers and, in an image project,
      the device path (device_path.py: the crop and the JPEG decode on the device; on a CPU machine
      they run on the CPU): what those change, the launcher, the config and the device path, does
      not depend on the source: it is tested on the folder image project, with the Slurm script's
      protocol under stub Slurm commands (test_slurm.py runs it under a real Slurm); the rest would
      only repeat the CPU answers' suite on this machine.
    """
    assert any(re.fullmatch(r"tests/test_\w+\.py", rel) for rel in project.files), "the project has no tests"
    env = project_env(project.path)
    source = project.answers.get("stream_backend") or project.answers["data_source"]
    selection = ["-m", "(slow or not slow) and not launcher and not common"]
    if project.answers["num_gpus"] > 0:
        if project.answers["data_format"] != "image" or source != "folder":
            pytest.skip("the GPU answers' launcher and config depend on neither source nor format: run on folder/image")
        own = ["tests/test_launch.py", "tests/test_config.py", "tests/test_device_path.py"]  # and the device path
        selection = ["-m", "not slow or slurm", *own]
    elif source == "parquet":
        image_only = ["test_launch.py", "test_parquet_s3.py"]
        own = PARQUET_OWN + (image_only if project.answers["data_format"] == "image" else [])
        selection += ["-k", "not kill_9_of_a_rank_restarts_the_group", *(f"tests/{name}" for name in own)]
    elif project.answers["data_format"] != "image":
        if source not in FORMAT_SOURCES[project.answers["data_format"]]:
            pytest.skip("a format runs on the folder source and on one that streams (FORMAT_SOURCES)")
        files = [f"tests/{name}" for name in (*FORMAT_FILES, f"test_{source}.py")]
        selection = ["-m", "not slow and not common", *files, "tests/test_bench.py::test_cli_sample_data_bench_train"]
    elif source == "folder":  # the launcher's faults, spread over two projects to even out the time
        two_nodes_kill = " and not one_of_two_nodes" if slurm_unavailable() is None else ""
        # its fast tests run with a user's changes (test_users_changes.py)
        selection = ["-m", "slow", "-k", f"not short_ddp_epochs{two_nodes_kill}"]
    elif source == "shards":
        launcher_elsewhere = "signal_to or stopped_rank or two_nodes or kill_9_of_a_rank_restarts"
        selection = ["-m", "(slow or not slow) and not common", "-k", f"not ({launcher_elsewhere})"]
        selection += [f"tests/{name}" for name in SHARDS_OWN]
    elif source == "sqlite":  # the kill -9s under torchrun run on folder and shards (see above)
        selection += ["-k", "not (a_mix_of_a_stream_and_a_map_style_source_killed or kill_9_of_a_rank_restarts)"]
    elif source == "http":  # what is its own; the rest runs over SQLite
        own = ["test_http.py", "test_sources.py", "test_launch.py", "test_bench.py::test_cli_sample_data_bench_train"]
        selection += ["-k", "not kill_9_of_a_rank_restarts_the_group", *(f"tests/{name}" for name in own)]
    result = run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *selection],
        project.path,
        env=env,
        timeout=RENDERED_TESTS_TIMEOUT_S,
    )
    assert result.returncode == 0, (
        f"the rendered project's tests failed (exit {result.returncode}):\n{tail(result.stdout)}"
    )
    assert re.search(r"\b\d+ passed\b", result.stdout), f"no test passed:\n{tail(result.stdout)}"


# ---------------------------------------------------------------------------------------------
# Without --trust (--skip-tasks), and with --trust (the post-copy hook)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def untrusted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dst = tmp_path_factory.mktemp("untrusted") / "project"
    render(dst, tasks=False)
    return dst


@pytest.fixture(scope="module")
def trusted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, bytes]]:
    dst = tmp_path_factory.mktemp("trusted") / "project"
    render(dst, tasks=True)
    return dst, rendered_files(dst)


def test_skip_tasks_renders_no_git_repo(untrusted: Path) -> None:
    assert (untrusted / ".copier-answers.yml").is_file()
    assert not (untrusted / ".git").exists()


def test_skip_tasks_project_runs(untrusted: Path) -> None:
    result = run([sys.executable, "-m", "my_training", "--help"], untrusted, env=project_env(untrusted))
    assert result.returncode == 0, tail(result.stdout)
    assert "usage: python -m my_training" in result.stdout
    for command in ("sample-data", "bench", "train", "launch"):
        assert command in result.stdout, f"`{command}` missing from --help:\n{result.stdout}"


def test_trust_makes_a_git_repo_with_one_commit(trusted: tuple[Path, dict[str, bytes]]) -> None:
    path, files = trusted
    assert (path / ".git").is_dir()
    assert git(path, "rev-parse", "--show-toplevel") == str(path.resolve())
    assert git(path, "rev-list", "--count", "HEAD") == "1"
    assert git(path, "status", "--porcelain", "--untracked-files=all") == "", (
        "work tree not clean after the first commit"
    )
    committed = set(git(path, "ls-files").splitlines())
    assert committed == set(files), f"first commit differs from the render: {sorted(committed ^ set(files))}"


def test_trust_inside_a_repo_creates_no_nested_repo(tmp_path: Path) -> None:
    outer = tmp_path / "outer"
    outer.mkdir()
    git(outer, "init", "-q")
    (outer / "README").write_text("outer\n", encoding="utf-8")
    git(outer, "add", "README")
    git(outer, "commit", "-q", "-m", "outer")
    dst = outer / "projects" / "feed"
    render(dst, tasks=True)
    assert (dst / "src" / "my_training" / "__main__.py").is_file()
    assert not (dst / ".git").exists(), "a nested git repository was created"
    assert git(dst, "rev-parse", "--show-toplevel") == str(outer.resolve())
    assert git(outer, "rev-list", "--count", "HEAD") == "1", "the hook committed into the enclosing repository"
    assert git(outer, "status", "--porcelain") == "?? projects/", "the render should be left untracked for the owner"


def test_trust_commits_without_a_git_identity(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hook names its own committer, so a machine without user.name/user.email still gets a commit."""
    from plumbum import local

    template = copy_template_repo(tmp_path / "template")
    dst = tmp_path / "project"
    with local.env():
        for key in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL"):
            monkeypatch.delenv(key)
            del local.env[key]
        monkeypatch.delenv("EMAIL", raising=False)
        local.env.pop("EMAIL", None)
        render(dst, tasks=True, src=template, vcs_ref="v0.1.0")
    assert git(dst, "rev-list", "--count", "HEAD") == "1"
    assert git(dst, "log", "-1", "--format=%an <%ae>") == "torchfeed <torchfeed@localhost>"
