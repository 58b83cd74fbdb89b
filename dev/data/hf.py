"""
Hugging Face Hub access for the network-only scripts (synth.py, fineweb.py, evals.py):
list a dataset repository's data files and read their rows with pyarrow, without the
`datasets` package. Needs network access to huggingface.co (or HF_HUB_OFFLINE with a cache).
"""
from __future__ import annotations

import fnmatch
import json


def list_files(repo_id: str, patterns: list[str]) -> list[str]:
    """Files of a dataset repo matching any of the glob patterns, sorted."""
    from huggingface_hub import HfApi
    files = HfApi().list_repo_files(repo_id, repo_type="dataset")
    out = sorted(f for f in files if any(fnmatch.fnmatch(f, p) for p in patterns))
    if not out:
        raise RuntimeError(f"no files in dataset {repo_id} match {patterns}")
    return out


def download(repo_id: str, filename: str) -> str:
    from huggingface_hub import hf_hub_download
    return hf_hub_download(repo_id, filename, repo_type="dataset")


def iter_rows(path: str, columns: list[str] | None = None, batch_size: int = 4096):
    """Rows (dicts) of a local .parquet, .jsonl or .json file."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq
        pf = pq.ParquetFile(path)
        for batch in pf.iter_batches(batch_size=batch_size, columns=columns):
            yield from batch.to_pylist()
    elif path.endswith(".jsonl"):
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)
    elif path.endswith(".json"):
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        yield from (data if isinstance(data, list) else data.get("data", []))
    else:
        raise ValueError(f"unsupported data file {path}")
