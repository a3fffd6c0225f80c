#!/usr/bin/env bash
# SGLang with dfkv as the HiCache L3 backend (docs/CONNECTORS.md §3).
#   pip install 'dfkv[sglang]'        # or: pip install dfkv sglang==0.5.23
# DFKV_MEMBERS lists the cache nodes; every SGLang rank opens its own client lazily.
set -euo pipefail
: "${MODEL:=Qwen/Qwen3-8B}"
: "${DFKV_MEMBERS:=n1=10.0.0.10:12000,n2=10.0.0.11:12000}"
exec python -m sglang.launch_server --model-path "$MODEL" --tp 2 \
  --enable-hierarchical-cache --page-size 64 --hicache-ratio 2 \
  --hicache-mem-layout page_first \
  --hicache-storage-backend dynamic \
  --hicache-storage-backend-extra-config "{\"backend_name\": \"dfkv\",
    \"module_path\": \"dfkv.connectors.sglang_hicache\", \"class_name\": \"DfkvHiCacheStorage\",
    \"interface_v1\": 1, \"members\": \"$DFKV_MEMBERS\"}"
