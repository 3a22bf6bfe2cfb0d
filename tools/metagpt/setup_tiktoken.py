#!/usr/bin/env python
"""Put tiktoken's cl100k_base BPE file into a TIKTOKEN_CACHE_DIR without downloading it.

tiktoken fetches cl100k_base from openaipublic.blob.core.windows.net on first use and caches it
under ``sha1(url)`` in ``TIKTOKEN_CACHE_DIR``. The registry package ``bpe-openai`` ships the same
file (``bpe_openai/data/cl100k_base.tiktoken.gz``); this copies it there (run it with a MetaGPT
venv's Python, where bpe-openai is installed) and checks that tiktoken loads it.

    .venvs/metagpt-sop/bin/python tools/metagpt/setup_tiktoken.py .venvs/tiktoken_cache
"""

import gzip
import hashlib
import os
import sys
from pathlib import Path

URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"


def main() -> None:
    cache = Path(sys.argv[1] if len(sys.argv) > 1 else ".venvs/tiktoken_cache").resolve()
    cache.mkdir(parents=True, exist_ok=True)
    import bpe_openai

    src = Path(bpe_openai.__file__).parent / "data" / "cl100k_base.tiktoken.gz"
    dst = cache / hashlib.sha1(URL.encode()).hexdigest()
    dst.write_bytes(gzip.decompress(src.read_bytes()))
    os.environ["TIKTOKEN_CACHE_DIR"] = str(cache)
    import tiktoken

    n = len(tiktoken.get_encoding("cl100k_base").encode("hello world"))
    print(f"cl100k_base -> {dst} (tiktoken ok: 'hello world' = {n} tokens)")


if __name__ == "__main__":
    main()
