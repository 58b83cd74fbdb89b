"""scripts/setup.sh's Python side, without installing anything (issue 51, target 5): a copy of
the script in a scratch checkout, its venvs under a scratch ATTN_VENV_ROOT, each a real venv
without pip (so `python -I` imports only what the venv holds) marked with the .complete-TIER
files of the tiers it holds, and a pip that records its arguments and does an editable install
as a .pth file naming the checkout. SKIP_APT=1 skips the Debian packages.

- The editable install happens whatever PYTHONPATH says (make exports PYTHONPATH=<checkout>, so
  a check that imported `study` through it took the packages for installed, and the docs'
  commands failed outside make), and only once.
- .venv is kept when it links a venv of this requirements.txt with the tier asked for or a
  higher one (`make setup-demo` from a shell with another ATTN_VENV_ROOT used to re-point it
  from the full tier to a fresh demo tier), and a re-pointing says from what to what and why.
Under a second on 2 cores.
"""
import hashlib
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAKE_PIP = """#!/bin/sh
echo "$*" >> {log}
case " $* " in   # an editable install of the current directory: a .pth naming it
  *" -e . "*) for sp in {venv}/lib/python3*/site-packages; do echo "$PWD" > "$sp/_attn_editable.pth"; done ;;
esac
"""


def checkout(tmp_path):
    """A scratch checkout: setup.sh and requirements.txt, and the two packages (empty)."""
    co = tmp_path / "checkout"
    (co / "scripts").mkdir(parents=True)
    for name in ("scripts/setup.sh", "requirements.txt"):
        shutil.copy(os.path.join(ROOT, name), co / name)
    for package in ("study", "attnref"):
        (co / package).mkdir()
        (co / package / "__init__.py").write_text("")
    return co


def venv_name(co):
    return "venv-" + hashlib.sha256((co / "requirements.txt").read_bytes()).hexdigest()[:12]


def make_venv(path, tiers):
    """A venv at `path` holding `tiers` (their marker files), its pip the recording fake."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    for tier in tiers:
        (path / f".complete-{tier}").touch()
    pip = path / "bin" / "pip"
    pip.write_text(FAKE_PIP.format(log=path / "pip.log", venv=path))
    pip.chmod(0o755)
    return path


def pip_calls(venv):
    log = venv / "pip.log"
    return log.read_text().splitlines() if log.exists() else []


def make_uv(venv, rc):
    """A uv in `venv` that records its arguments in uv.log and exits `rc`."""
    uv = venv / "bin" / "uv"
    uv.write_text(f'#!/bin/sh\necho "$*" >> {venv / "uv.log"}\nexit {rc}\n')
    uv.chmod(0o755)


def uv_calls(venv):
    log = venv / "uv.log"
    return log.read_text().splitlines() if log.exists() else []


def demo_packages():
    """The demo tier's lines of requirements.txt."""
    lines, tier = [], None
    for line in open(os.path.join(ROOT, "requirements.txt")):
        line = line.strip()
        if line.startswith("# tier: "):
            tier = line.split()[2]
        elif line and not line.startswith("#") and tier == "demo":
            lines.append(line)
    return lines


def setup(co, venv_root, *args, **env_extra):
    """setup.sh of checkout `co`, as make runs it: PYTHONPATH is the checkout."""
    env = dict(os.environ, SKIP_APT="1", ATTN_VENV_ROOT=str(venv_root), PYTHONPATH=str(co), **env_extra)
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "ATTN_SETUP_PIP"):
        if name not in env_extra:
            env.pop(name, None)
    proc = subprocess.run(["bash", str(co / "scripts" / "setup.sh"), *args], cwd="/", env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def test_setup_installs_the_packages_editable_whatever_pythonpath_says(tmp_path):
    co = checkout(tmp_path)
    venv = make_venv(tmp_path / "venvs" / venv_name(co), ["demo"])
    out = setup(co, tmp_path / "venvs", "--tier", "demo")
    assert f"setup: installing attnref and study from {co.resolve()} into {venv} (editable, seconds)" in out, out
    assert any(" -e ." in call + " " for call in pip_calls(venv)), pip_calls(venv)
    assert os.readlink(co / ".venv") == str(venv)
    # what the docs' commands get: the venv's python, no PYTHONPATH, any directory
    probe = subprocess.run([str(co / ".venv" / "bin" / "python"), "-I", "-c", "import study, attnref"], cwd="/",
                           capture_output=True, text=True)
    assert probe.returncode == 0, probe.stderr
    calls = len(pip_calls(venv))
    out = setup(co, tmp_path / "venvs", "--tier", "demo")
    assert len(pip_calls(venv)) == calls and "installing" not in out, out   # installed: not again


def test_setup_keeps_a_venv_with_the_tier_asked_for_or_a_higher_one(tmp_path):
    co = checkout(tmp_path)
    full = make_venv(tmp_path / "usual" / venv_name(co), ["demo", "full"])
    demo = make_venv(tmp_path / "other" / venv_name(co), ["demo"])
    os.symlink(full, co / ".venv")
    for tier in ("demo", "full"):
        out = setup(co, tmp_path / "other", "--tier", tier)
        assert os.readlink(co / ".venv") == str(full), out
        assert "re-pointing" not in out and "creating" not in out, out
    assert pip_calls(demo) == []   # the other root's venv was not touched


def test_setup_says_from_what_to_what_when_it_re_points_the_venv(tmp_path):
    co = checkout(tmp_path)
    demo = make_venv(tmp_path / "usual" / venv_name(co), ["demo"])
    full = make_venv(tmp_path / "other" / venv_name(co), ["demo", "full"])
    os.symlink(demo, co / ".venv")
    out = setup(co, tmp_path / "other", "--tier", "full")
    assert os.readlink(co / ".venv") == str(full)
    assert (f"setup: re-pointing .venv from {demo} (tiers demo) to {full} (tiers demo, full): "
            f"it lacks the 'full' tier") in out, out
    # a venv of another requirements.txt is left, with the same message, even when it holds more
    stale = make_venv(tmp_path / "usual" / "venv-000000000000", ["demo", "full"])
    os.unlink(co / ".venv")
    os.symlink(stale, co / ".venv")
    out = setup(co, tmp_path / "other", "--tier", "demo")
    assert os.readlink(co / ".venv") == str(full)
    assert (f"setup: re-pointing .venv from {stale} (tiers demo, full) to {full} (tiers demo, full): "
            f"it was made from another requirements.txt") in out, out


def test_setup_installs_a_tier_with_uv_and_with_pip_where_uv_fails(tmp_path):
    co = checkout(tmp_path)
    packages = " ".join(demo_packages())
    assert packages, "requirements.txt has no demo tier"
    # uv there: it installs the tier, with bytecode, into the venv's python, the index passed on
    venv = make_venv(tmp_path / "a" / venv_name(co), [])
    make_uv(venv, 0)
    setup(co, tmp_path / "a", "--tier", "demo", PIP_INDEX_URL="https://mirror.example/simple")
    assert uv_calls(venv) == [f"pip install -q --python {venv}/bin/python --compile-bytecode "
                              f"--index-url https://mirror.example/simple {packages}"], uv_calls(venv)
    assert not any("numpy" in call for call in pip_calls(venv)), pip_calls(venv)
    assert (venv / ".complete-demo").exists()
    # uv fails: pip installs the tier, and setup says so
    os.unlink(co / ".venv")
    venv = make_venv(tmp_path / "b" / venv_name(co), [])
    make_uv(venv, 1)
    out = setup(co, tmp_path / "b", "--tier", "demo")
    assert "setup: uv could not install them; pip will" in out, out
    assert f"install -q --disable-pip-version-check {packages}" in pip_calls(venv), pip_calls(venv)
    # no uv to be had (the fake pip installs nothing), or ATTN_SETUP_PIP=1: pip alone, silently
    for name, env in (("c", {}), ("d", {"ATTN_SETUP_PIP": "1"})):
        os.unlink(co / ".venv")
        venv = make_venv(tmp_path / name / venv_name(co), [])
        if env:
            make_uv(venv, 0)
        out = setup(co, tmp_path / name, "--tier", "demo", **env)
        assert "uv" not in out and uv_calls(venv) == [], out
        assert f"install -q --disable-pip-version-check {packages}" in pip_calls(venv), pip_calls(venv)
