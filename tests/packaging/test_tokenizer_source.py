"""Where the tokenizer comes from: the bundled copy (checked), a folder, or the Hub (through a loopback fake)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from eagle_assets.tokenization.kimi_tokenizer import load_kimi_tokenizer
from eagle_assets.tokenization.tokenizer_source import (
    BUNDLED_DIR,
    TokenizerFilesError,
    TokenizerIntegrityError,
    hub_spec,
    resolve_tokenizer_dir,
)
from tests.packaging.fake_hub import serve_repo

KNOWN_TEXT = "Hello, world! 你好，世界！"
KNOWN_IDS = [19180, 11, 2695, 0, 220, 33845, 378, 2243, 856]
REPO_ROOT = Path(__file__).resolve().parents[2]


def test_bundled_copy_is_the_default_and_gives_the_known_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EAGLE_FORGE_TOKENIZER", raising=False)
    assert resolve_tokenizer_dir() == BUNDLED_DIR
    tok = load_kimi_tokenizer()
    assert tok.directory == BUNDLED_DIR
    assert tok.encode_ordinary(KNOWN_TEXT) == KNOWN_IDS
    assert tok.special_tokens["<|im_end|>"] == 163586 and tok.vocab_size == 163_840
    assert (BUNDLED_DIR / "NOTICE").read_text().count("Modified MIT") >= 1


def test_a_damaged_copy_is_refused(tmp_path: Path) -> None:
    copy = tmp_path / "tok"
    shutil.copytree(BUNDLED_DIR, copy)
    with (copy / "tiktoken.model").open("ab") as f:
        f.write(b"\n")
    with pytest.raises(TokenizerIntegrityError, match=r"tiktoken\.model"):
        load_kimi_tokenizer(copy)
    (copy / "tiktoken.model").unlink()
    with pytest.raises(TokenizerFilesError, match=str(copy / "tiktoken.model")):
        load_kimi_tokenizer(copy)


def test_env_names_a_folder_and_a_missing_one_says_which(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy = tmp_path / "upstream"
    copy.mkdir()
    for name in ("tiktoken.model", "tokenizer_config.json"):  # no SHA256SUMS: a user's folder is not checked
        shutil.copy(BUNDLED_DIR / name, copy / name)
    monkeypatch.setenv("EAGLE_FORGE_TOKENIZER", str(copy))
    assert resolve_tokenizer_dir() == copy
    assert load_kimi_tokenizer().encode_ordinary(KNOWN_TEXT) == KNOWN_IDS
    monkeypatch.setenv("EAGLE_FORGE_TOKENIZER", str(tmp_path / "gone"))
    with pytest.raises(TokenizerFilesError, match=str(tmp_path / "gone")):
        resolve_tokenizer_dir()


def test_hub_specs() -> None:
    assert hub_spec("moonshotai/Kimi-K2.5") == ("moonshotai/Kimi-K2.5", None)
    assert hub_spec("hf:moonshotai/Kimi-K2.5@abc123") == ("moonshotai/Kimi-K2.5", "abc123")
    assert hub_spec("/abs/path") is None and hub_spec("./rel/dir") is None
    with pytest.raises(TokenizerFilesError, match="not a Hugging Face repo id"):
        hub_spec("hf:no-slash")


_LOAD = f"""
import json, sys
from eagle_assets.tokenization.kimi_tokenizer import load_kimi_tokenizer
tok = load_kimi_tokenizer(sys.argv[1] if len(sys.argv) > 1 else None)
ids = tok.encode_ordinary({KNOWN_TEXT!r})
print(json.dumps({{"dir": str(tok.directory), "ids": ids, "template": tok.chat_template is not None}}))
"""


def _load_in_child(env: dict[str, str], *args: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _LOAD, *args], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_hub_repo_id_downloads_into_the_hf_cache_then_works_offline(tmp_path: Path) -> None:
    """``EAGLE_FORGE_TOKENIZER=moonshotai/Kimi-K2.5`` goes through the real huggingface_hub client (here to a
    loopback fake of the Hub), lands in its cache, and the next run loads it with HF_HUB_OFFLINE=1."""
    env = {
        **os.environ,
        "HF_HOME": str(tmp_path / "hf"),
        "EAGLE_FORGE_TOKENIZER": "moonshotai/Kimi-K2.5",
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    env.pop("HF_HUB_OFFLINE", None)
    with serve_repo("moonshotai/Kimi-K2.5", BUNDLED_DIR) as (endpoint, requests):
        env["HF_ENDPOINT"] = endpoint
        got = _load_in_child(env)
    assert got["ids"] == KNOWN_IDS and got["template"]
    assert Path(got["dir"]).is_relative_to(tmp_path / "hf")
    fetched = {r.rsplit("/", 1)[-1] for r in requests if r.startswith("GET")}
    assert fetched == {"tiktoken.model", "tokenizer_config.json", "chat_template.jinja"}
    # The fake is gone now: only the cache can answer.
    offline = _load_in_child({**env, "HF_HUB_OFFLINE": "1"})
    assert offline == got


def test_hub_without_the_optional_template_file(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("tiktoken.model", "tokenizer_config.json"):
        shutil.copy(BUNDLED_DIR / name, repo / name)
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_TELEMETRY": "1"}
    env.pop("HF_HUB_OFFLINE", None)
    with serve_repo("someone/kimi-tok", repo) as (endpoint, _):
        got = _load_in_child({**env, "HF_ENDPOINT": endpoint}, "hf:someone/kimi-tok")
    assert got["ids"] == KNOWN_IDS and got["template"]  # the template inside tokenizer_config.json


def test_nothing_reads_the_shared_folder_beside_the_repo() -> None:
    """Users have no ``../shared``: no code, script or test may point there (CI also runs from a lone copy)."""
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
    this_file = Path(__file__).relative_to(REPO_ROOT).as_posix()
    offenders = []
    for rel in tracked.split():
        if not rel.endswith((".py", ".sh", ".yaml", ".toml", ".cfg")) or rel == this_file:
            continue
        text = (REPO_ROOT / rel).read_text(encoding="utf-8", errors="replace")
        if "shared/tokenizers" in text or '/ "shared"' in text or "../shared" in text:
            offenders.append(rel)
    assert offenders == []
