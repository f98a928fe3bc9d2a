"""The package as others install it, and the environments that install it.

* A wheel (``pip install .``, not editable) carries every chapter's CUDA C++ and C sources and the committed files
  the library reads at run time, and one call per chapter works from it in a fresh environment, away from the
  repository (``slow``: builds and installs the wheel).
* ``environment.yml`` builds the environment the Makefile builds: the same extras, the same torch rule.
* ``tools/install_torch.py`` says which PyTorch build it takes and why.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import tomllib
import zipfile
from pathlib import Path

import pytest

from studylog import paths
from studylog.chapter import CHAPTERS

ROOT = paths.REPO_ROOT
pytestmark = pytest.mark.skipif(not paths.CHECKOUT, reason="checks the repository's packaging files")


# --------------------------------------------------------------------------------------------------
# the wheel
# --------------------------------------------------------------------------------------------------

#: Run by the fresh environment's Python, from an empty folder: one call per chapter on the CPU, at small sizes.
CHAPTER_CALLS = textwrap.dedent('''
    import sys, traceback
    from pathlib import Path

    import torch

    import studylog
    from studylog import paths, runtime

    site = Path(sys.argv[1])
    assert Path(studylog.__file__).is_relative_to(site), f"studylog imported from {studylog.__file__}, not the wheel"
    assert not paths.CHECKOUT and paths.ASSETS == paths.SHIPPED_ASSETS, (paths.CHECKOUT, paths.ASSETS)
    assert runtime.mode() == "interpreter"
    g = torch.Generator().manual_seed(0)

    def env():
        from studylog import chapter, cuda

        chapter.get("env")
        cuda.compile_source("read_only")           # studylog/csrc
        cuda.compile_source("tour_axpy")

    def fsm():
        from studylog import fsm

        vocab = fsm.make_vocabulary({"a": 0, "b": 1, "ab": 2}, eos_id=3)
        auto = fsm.compile_fsm("(ab)+", vocab, "tiny")
        state = auto.next_state(auto.initial, 2)
        assert state is not None and auto.is_final(state)

    def masked_lm_head():
        from studylog import data
        from studylog import masked_lm_head as mlh

        rule = mlh.dispatch_rule()             # read from the committed results the wheel carries
        assert rule is not mlh.FALLBACK_RULE and rule.source.startswith("measured on"), rule.source
        V, D = 256, 32
        h = torch.randn(2, D, generator=g).half()
        w = torch.randn(V, D, generator=g).half()
        allowed = mlh.AllowedTokens.from_ids([[1, 5, 9], list(range(0, V, 3))], V, device="cpu")
        mlh.check_logits(mlh.masked_logits(h, w, allowed), h, w, allowed)
        assert len(data.load_masks()) > 0          # the FSM chapter's real masks

    def ngram():
        from studylog import ngram

        inputs, draft, this_time = ngram.make_batch(4, 64, 32, seed=1)
        want = ngram.reference_ngram_match(inputs, draft.clone(), this_time.clone())
        got = ngram.step01_cpu_path(inputs, draft.clone(), this_time.clone())   # compiles csrc/ngram_cpu_path.c
        assert ngram.same_state(want, got)
        assert "ngram_stream" in ngram.CHAPTER.show_source(11).text
        ngram.corpus_batch("text", 2, 64, 32)       # the committed corpus

    def ctc():
        from studylog import ctc, cuda

        x = torch.randn(6, 2, 5, generator=g)
        loss, grad = ctc.reference_ctc(x, torch.tensor([[1, 2], [3, 0]]), [6, 4], [2, 1])
        assert bool(torch.isfinite(loss).all())
        assert "ctc_warps_direction" in ctc.CHAPTER.show_source(14).text
        name = ctc.fused.fused_kernel_names(7, 4)[1]  # NVRTC over csrc/*.cu and its headers
        cuda.compile_source(ctc.fused.source_of(name), name_expressions=[name])

    def ternary():
        from studylog import ternary as T

        w = torch.randint(-1, 2, (64, 512), generator=g).to(torch.int8)
        x = torch.randn(512, generator=g)
        z = T.step05_gemv(x, T.PackedTernary.pack(w, "2bit"), 0.5)
        assert T.error_ratio(z, x, w, 0.5) <= T.FP32_TOLERANCE
        assert "w2a8_kernel" in T.CHAPTER.show_source(23).text  # the .cu source travels in the wheel

    def multi_item():
        from studylog import multi_item as mi

        batch = mi.MultiItemBatch.from_item_lens([4], [[3, 2, 4]], device="cpu")
        q, k, v = (torch.randn(2, batch.total_tokens, 64, generator=g) for _ in range(3))
        out = mi.multi_item_attention(q, k, v, batch)
        assert torch.allclose(out.double(), mi.reference_attention(q, k, v, batch), atol=1e-4)

    def decode():
        from studylog import decode

        model = decode.LlamaModel(decode.model_config("tiny"), dtype=torch.float32, seed=1)
        decoder = decode.Decoder(model, batch=1, max_seq=64)
        grammar = decode.Grammar.from_suite(decode.suite_names()[0])
        assert len(decoder.generate(grammar, ["hi"], "masked_head", max_new_tokens=4).ids[0]) >= 1

    def speculate():
        from studylog import decode, speculate
        import torch

        model = decode.LlamaModel(decode.model_config("tiny"), dtype=torch.float32, seed=1)
        decoder = speculate.SpeculativeDecoder(model, batch=1, max_seq=64)
        grammar = decode.Grammar.from_suite(decode.suite_names()[0])
        assert len(speculate.step04_gated_draft(decoder, grammar, ["hi hi"], max_new_tokens=4).ids[0]) >= 1
        assert len(speculate.requests.document_names()) >= 20  # the workload ships in the wheel

    for call in (env, fsm, masked_lm_head, ngram, ctc, ternary, multi_item, decode, speculate):
        try:
            call()
        except Exception:
            traceback.print_exc()
            print(f"FAILED {call.__name__}", flush=True)
        else:
            print(f"ok {call.__name__}", flush=True)

    def command_line(*argv):
        """``python -m studylog ARGV`` as the shell runs it (its ``__main__``, its exit status), in this interpreter
        (a second one would import torch again): (exit status, stdout, stderr). An exception that escapes it ends
        this script with its traceback."""
        import contextlib, io, runpy

        out, err = io.StringIO(), io.StringIO()
        sys.argv = ["studylog", *argv]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                runpy.run_module("studylog", run_name="__main__", alter_sys=True)
                code = 0
            except SystemExit as exc:
                code = exc.code
        return code, out.getvalue(), err.getvalue()

    import json

    print("COMMANDS " + json.dumps({" ".join(a): command_line(*a) for a in (["info"], ["bench", "env"])}), flush=True)
''')


def _source_tree(dest: Path) -> Path:
    """The files a build reads, copied out of the repository (the build writes build/ beside them)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "_assets")
    dest.mkdir()
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(ROOT / "studylog", dest / "studylog", ignore=ignore)
    shutil.copytree(ROOT / "assets", dest / "assets", ignore=shutil.ignore_patterns("figures"))
    return dest


def _nvrtc_root() -> str | None:
    """The folder above the NVRTC library of this environment: a fresh environment looks for it in its own
    site-packages only (cuda-pathfinder), and takes it from ``CUDA_PATH`` here."""
    for lib in sorted(Path(sysconfig.get_paths()["purelib"]).glob("nvidia/*/lib/libnvrtc.so*")):
        return str(lib.parent.parent)
    return None


@pytest.mark.slow
def test_the_wheel_carries_every_source_and_runs_each_chapter_away_from_the_repository(tmp_path):
    src = _source_tree(tmp_path / "src")
    dist = tmp_path / "dist"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
                            "-w", str(dist), "-q"], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr
    (wheel,) = dist.glob("studylog-*.whl")

    names = set(zipfile.ZipFile(wheel).namelist())
    sources = sorted(p for p in paths.PACKAGE.rglob("*") if p.is_file() and p.parent.name == "csrc")
    assert sources and len({p.parent for p in sources}) >= 4
    missing = [str(p.relative_to(ROOT)) for p in sources if str(p.relative_to(ROOT)) not in names]
    assert not missing, f"the wheel lacks {missing}"
    modules = [str(p.relative_to(ROOT)) for p in paths.PACKAGE.rglob("*.py") if "__pycache__" not in p.parts]
    assert not [m for m in modules if m not in names], "the wheel lacks modules (a package without __init__.py?)"
    for shipped in ["bench/*/masked_lm_head.json", "data/*"]:
        want = {f"studylog/_assets/{p.relative_to(ROOT / 'assets')}" for p in (ROOT / "assets").glob(shipped)
                if p.is_file()}
        assert want and want <= names, shipped
    assert not any(n.startswith(("tests/", "lab/", "notebooks/", "assets/")) for n in names)

    # A fresh environment holding only the wheel; its dependencies are this environment's, through a .pth file
    # (a plain folder on sys.path: this environment's own .pth files, the editable install among them, stay out).
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "studylog_test_dependencies.pth").write_text("\n".join(sorted(deps)) + "\n")
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                              "--no-index", "-q", str(wheel)], capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr

    run_dir = tmp_path / "elsewhere"
    run_dir.mkdir()
    (tmp_path / "chapter_calls.py").write_text(CHAPTER_CALLS)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    env |= {"CUDA_VISIBLE_DEVICES": "", "STUDYLOG_NVRTC_CACHE": "off", "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "PYTHONNOUSERSITE": "1", "PYTHONWARNINGS": "ignore::RuntimeWarning"}
    if _nvrtc_root() is not None:
        env["CUDA_PATH"] = _nvrtc_root()
    out = subprocess.run([python, str(tmp_path / "chapter_calls.py"), str(site)], cwd=run_dir, env=env,
                         capture_output=True, text=True, timeout=600)
    report = out.stdout + out.stderr
    assert out.returncode == 0, report
    for name in CHAPTERS:
        assert f"ok {name}" in out.stdout, report

    (line,) = [line for line in out.stdout.splitlines() if line.startswith("COMMANDS ")]
    commands = json.loads(line.removeprefix("COMMANDS "))
    code, stdout, stderr = commands["info"]
    assert code == 0 and "an installed package" in stdout, stdout + stderr
    code, stdout, stderr = commands["bench env"]
    assert code == 2 and stderr.startswith("error: ") and "--out" in stderr, stderr


def test_package_data_names_every_chapters_sources():
    """Cheap twin of the wheel test: the patterns of [tool.setuptools.package-data] match every source file
    under a csrc folder, in every package."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    patterns = config.get("*", [])
    for path in paths.PACKAGE.rglob("*"):
        if path.is_file() and path.parent.name == "csrc":
            owner = path.parent.parent  # the package that holds csrc/
            assert any(path.match(f"{owner}/{p}") for p in patterns), f"no package-data pattern ships {path}"


# --------------------------------------------------------------------------------------------------
# environment.yml against the Makefile
# --------------------------------------------------------------------------------------------------

def _makefile_extras() -> tuple[set[str], set[str]]:
    """The extras the Makefile installs into .venv (the install target) and what `make lab` adds."""
    text = (ROOT / "Makefile").read_text()
    (extras,) = re.findall(r"^EXTRAS\s*:=\s*\.\[([^\]]*)\]$", text, re.M)  # the install target's, in a variable
    assert re.search(r'pip install[^"]*-e "\$\(EXTRAS\)"', text), "the install target must install $(EXTRAS)"
    (lab,) = re.findall(r'pip install[^\n]*-e "\.\[([^\]]*)\]"', text)  # what `make lab` adds
    return set(extras.split(",")), set(lab.split(","))


def _install_torch():
    spec = importlib.util.spec_from_file_location("install_torch", ROOT / "tools" / "install_torch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_environment_yml_builds_the_makefiles_environment():
    yaml = pytest.importorskip("yaml")
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    deps = env["dependencies"]
    (pip,) = [d["pip"] for d in deps if isinstance(d, dict) and "pip" in d]
    (editable,) = [p for p in pip if p.startswith("-e ")]
    extras = set(re.fullmatch(r"-e \.\[([^\]]*)\]", editable).group(1).split(","))
    install, lab = _makefile_extras()
    assert extras == install | lab, (extras, install, lab)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert extras <= set(project["optional-dependencies"])

    torch_rule = _install_torch()
    assert torch_rule.CPU_SPEC in pip, "environment.yml must pin the CPU build tools/install_torch.py takes"
    assert f"--extra-index-url {torch_rule.CPU_INDEX}" in pip
    assert pip.index(torch_rule.CPU_SPEC) < pip.index(editable), "torch comes before the package"

    (python,) = [d for d in deps if isinstance(d, str) and d.startswith("python=")]
    minimum = tuple(int(v) for v in project["requires-python"].removeprefix(">=").split("."))
    assert tuple(int(v) for v in python.removeprefix("python=").split(".")) >= minimum


def test_the_lab_extra_brings_ipywidgets():
    """tqdm's notebook progress bars need ipywidgets (else TqdmWarning: IProgress not found)."""
    lab = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["lab"]
    assert any(re.match(r"ipywidgets\b", req) for req in lab), lab


# --------------------------------------------------------------------------------------------------
# tools/install_torch.py says what it takes
# --------------------------------------------------------------------------------------------------

def test_install_torch_says_which_build_and_why(monkeypatch, capsys):
    module = _install_torch()
    calls = []
    monkeypatch.setattr(module.subprocess, "call", lambda cmd: calls.append(cmd) or 0)
    monkeypatch.setattr(module, "reachable", lambda host: False)
    monkeypatch.delenv("STUDYLOG_TORCH", raising=False)

    monkeypatch.setattr(module.shutil, "which", lambda name: None)
    monkeypatch.setattr(module, "installed_torch", lambda: None)
    assert module.main() == 0
    out = capsys.readouterr().out
    assert "CPU build" in out and "nvidia-smi" in out and module.CPU_SPEC in out
    assert calls[-1][-1] == module.CPU_SPEC

    monkeypatch.setattr(module, "has_nvidia_gpu", lambda: True)
    assert module.main() == 0
    out = capsys.readouterr().out
    assert "CUDA build" in out and "GPU" in out

    monkeypatch.setenv("STUDYLOG_TORCH", "torch==2.5.0")
    assert module.main() == 0
    assert "STUDYLOG_TORCH" in capsys.readouterr().out and calls[-1][-1] == "torch==2.5.0"
