#!/usr/bin/env bash
# vLLM with dfkv as its KV connector, no LMCache in between (docs/CONNECTORS.md §5).
#   pip install 'dfkv[vllm]'
set -euo pipefail
: "${MODEL:=Qwen/Qwen3-8B}"
: "${DFKV_MEMBERS:=n1=10.0.0.10:12000,n2=10.0.0.11:12000}"
exec vllm serve "$MODEL" --tensor-parallel-size 2 --block-size 16 \
  --kv-transfer-config "{\"kv_connector\": \"DfkvConnector\",
    \"kv_connector_module_path\": \"dfkv.connectors.vllm_v1\", \"kv_role\": \"kv_both\",
    \"kv_connector_extra_config\": {\"members\": \"$DFKV_MEMBERS\", \"staging_blocks\": 64}}"
