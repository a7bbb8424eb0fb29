"""Where the Kimi tokenizer files come from: the copy bundled in the package, a folder, or the Hub.

Token ids are the product, so the tokenizer must be the same on every machine that touches the
data. The package therefore carries Moonshot's files (``kimi_k25/``, checked against ``SHA256SUMS``
at load: a truncated wheel or an edited file would silently change ids). A user who wants the
upstream files instead names a folder, or a Hugging Face repo id (``moonshotai/Kimi-K2.5``, or
``hf:owner/name@revision``) fetched by ``huggingface_hub`` into its normal cache, which also makes
later offline runs (``HF_HUB_OFFLINE=1``) work. The choice comes from an explicit argument (a
resource's config field), else ``EAGLE_FORGE_TOKENIZER``, else the bundled copy.
"""

import contextlib
import functools
import hashlib
import re
from pathlib import Path

from eagle_assets.errors import Systemic, TargetError
from eagle_assets.settings import current_settings

BUNDLED_DIR = Path(__file__).resolve().with_name("kimi_k25")
UPSTREAM_REPO = "moonshotai/Kimi-K2.5"
REQUIRED_FILES = ("tiktoken.model", "tokenizer_config.json")
OPTIONAL_FILES = ("chat_template.jinja",)
CHECKSUMS_FILE = "SHA256SUMS"
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class TokenizerFilesError(TargetError, Systemic, FileNotFoundError):
    """The tokenizer source lacks a file, or names nothing that exists."""


class TokenizerIntegrityError(TargetError, Systemic, RuntimeError):
    """A tokenizer file does not match the digest recorded beside it."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify_checksums(directory: Path) -> None:
    """Check every file listed in ``SHA256SUMS`` (``sha256sum`` format); no list, nothing to check."""
    listing = directory / CHECKSUMS_FILE
    if not listing.is_file():
        return
    for line in listing.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        digest, name = line.split(maxsplit=1)
        path = directory / name.lstrip("*")
        if not path.is_file():
            raise TokenizerFilesError(f"tokenizer file not found: {path} (listed in {listing})")
        actual = _sha256(path)
        if actual != digest:
            raise TokenizerIntegrityError(
                f"tokenizer file {path} has sha256 {actual}, expected {digest}: the copy is damaged or was edited"
            )


def require_files(directory: Path) -> None:
    for name in REQUIRED_FILES:
        path = directory / name
        if not path.is_file():
            raise TokenizerFilesError(f"tokenizer file not found: {path} (expected a Kimi tokenizer directory)")


def hub_spec(spec: str) -> tuple[str, str | None] | None:
    """``(repo_id, revision)`` when ``spec`` names a Hub repo: ``hf:owner/name[@rev]``, or ``owner/name``
    when no such folder exists here."""
    explicit = spec.startswith("hf:")
    body = spec[3:] if explicit else spec
    repo, _, revision = body.partition("@")
    if not _REPO_ID.match(repo):
        if explicit:
            raise TokenizerFilesError(f"{spec!r} is not a Hugging Face repo id (expected hf:owner/name[@revision])")
        return None
    if not explicit and (Path(spec).expanduser().exists() or spec.startswith((".", "~"))):
        return None
    return repo, revision or None


@functools.lru_cache(maxsize=8)
def download_from_hub(repo_id: str, revision: str | None = None) -> Path:
    """Fetch the tokenizer files into the Hugging Face cache; returns the snapshot folder holding them.

    Once per process: every stage asks for the tokenizer, and each ask would otherwise be a round trip
    to the Hub for every file."""
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError
    except ImportError as exc:  # pragma: no cover - transformers depends on huggingface_hub
        raise TokenizerFilesError("loading a tokenizer from the Hub needs huggingface_hub") from exc
    folder: Path | None = None
    for name in REQUIRED_FILES:
        folder = Path(hf_hub_download(repo_id, name, revision=revision)).parent
    for name in OPTIONAL_FILES:
        # Older releases keep the template only inside tokenizer_config.json.
        with contextlib.suppress(EntryNotFoundError):
            hf_hub_download(repo_id, name, revision=revision)
    assert folder is not None
    return folder


def resolve_tokenizer_dir(spec: str | Path | None = None) -> Path:
    """The folder to load: ``spec``, else ``$EAGLE_FORGE_TOKENIZER``, else the bundled copy (checked)."""
    raw = str(spec) if spec else current_settings().tokenizer
    if not raw or raw == "bundled":
        require_files(BUNDLED_DIR)
        return BUNDLED_DIR
    hub = hub_spec(raw)
    if hub is not None:
        return download_from_hub(*hub)
    directory = Path(raw).expanduser().resolve()
    if not directory.is_dir():
        source = "the config" if spec else "the EAGLE_FORGE_TOKENIZER setting"
        raise TokenizerFilesError(
            f"tokenizer folder not found: {directory} (from {source};"
            f" give a folder with {' and '.join(REQUIRED_FILES)}, a Hub repo id such as {UPSTREAM_REPO}, or 'bundled')"
        )
    return directory
