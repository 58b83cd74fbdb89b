"""
Hugging Face Hub access for the network-only scripts (synth.py, fineweb.py, evals.py):
list a dataset repository's data files and read their rows with pyarrow, without the
`datasets` package. Needs network access to huggingface.co (or HF_HUB_OFFLINE with a cache); without it the
calls raise a RuntimeError that says so.
"""
from __future__ import annotations

import fnmatch
import json


def _hub_call(what: str, call):
    """call(), with a failure to reach the Hub turned into a RuntimeError that says so."""
    try:
        return call()
    except Exception as e:  # noqa: BLE001 (httpx, requests and huggingface_hub errors share no base class)
        raise RuntimeError(f"{what}: cannot read it from the Hugging Face Hub ({type(e).__name__}: {e}). This needs "
                           f"the network (or HF_HUB_OFFLINE=1 with the files in the local cache); or give "
                           f"local copies of the files (--files, --local)") from e


def list_files(repo_id: str, patterns: list[str], first_match: bool = False) -> list[str]:
    """Files of a dataset repo matching any of the glob patterns, sorted; with first_match,
    only those of the first pattern that matches any (so that two copies are not both read)."""
    from huggingface_hub import HfApi
    files = _hub_call(f"dataset {repo_id}", lambda: HfApi().list_repo_files(repo_id, repo_type="dataset"))
    groups = [[p] for p in patterns] if first_match else [patterns]
    for group in groups:
        out = sorted(f for f in files if any(fnmatch.fnmatch(f, p) for p in group))
        if out:
            return out
    raise RuntimeError(f"no files in dataset {repo_id} match {patterns}")


def download(repo_id: str, filename: str) -> str:
    from huggingface_hub import hf_hub_download
    return _hub_call(f"{repo_id}/{filename}", lambda: hf_hub_download(repo_id, filename, repo_type="dataset"))


def iter_rows(path: str, columns: list[str] | None = None, batch_size: int = 4096):
    """Rows (dicts) of a local .parquet, .jsonl, .jsonl.zst (zstandard, as SlimPajama ships) or
    .json file."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq
        pf = pq.ParquetFile(path)
        for batch in pf.iter_batches(batch_size=batch_size, columns=columns):
            yield from batch.to_pylist()
    elif path.endswith(".jsonl") or path.endswith(".jsonl.zst"):
        import io

        import pyarrow as pa
        raw = pa.input_stream(path, compression="zstd" if path.endswith(".zst") else None)
        with io.TextIOWrapper(raw, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)
    elif path.endswith(".json"):
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        yield from (data if isinstance(data, list) else data.get("data", []))
    else:
        raise ValueError(f"unsupported data file {path}")
