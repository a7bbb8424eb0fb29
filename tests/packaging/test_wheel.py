"""The tokenizer travels inside the wheel: build it, install it in a fresh venv, load the tokenizer from there."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
KNOWN_TEXT = "Hello, world! 你好，世界！"
KNOWN_IDS = [19180, 11, 2695, 0, 220, 33845, 378, 2243, 856]
BUNDLED = ("tiktoken.model", "tokenizer_config.json", "chat_template.jinja", "NOTICE", "SHA256SUMS")


def _copy_sources(dest: Path) -> None:
    """The files a clone would have (tracked and new, not ignored): the build never sees local state."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout.split("\n")
    for rel in filter(None, listed):
        src = REPO_ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


@pytest.mark.slow
def test_wheel_carries_the_tokenizer_and_loads_it_in_a_fresh_venv(tmp_path: Path) -> None:
    src, dist, venv = tmp_path / "src", tmp_path / "dist", tmp_path / "venv"
    _copy_sources(src)
    # No build isolation: it would download setuptools, and tests reach nothing but loopback.
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist), str(src)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = dist.glob("eagle_forge-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in BUNDLED:
        assert f"eagle_assets/tokenization/kimi_k25/{name}" in names

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    # The fresh venv borrows only third-party packages (tiktoken, jinja2...) from ours, appended after its own
    # site-packages; .pth files there (our editable install's finder) are not processed, so eagle_assets can only
    # come from the wheel.
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (site / "zz_borrowed_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    probe = (
        "import json, eagle_assets\n"
        "from eagle_assets.tokenization.kimi_tokenizer import load_kimi_tokenizer\n"
        "tok = load_kimi_tokenizer()\n"
        f"print(json.dumps({{'pkg': eagle_assets.__file__, 'dir': str(tok.directory),"
        f" 'ids': tok.encode_ordinary({KNOWN_TEXT!r}), 'template': bool(tok.chat_template)}}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "EAGLE_FORGE_TOKENIZER")}
    out = subprocess.run([str(python), "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert Path(got["pkg"]).is_relative_to(site), got["pkg"]
    assert Path(got["dir"]) == site / "eagle_assets" / "tokenization" / "kimi_k25"
    assert got["ids"] == KNOWN_IDS and got["template"]
