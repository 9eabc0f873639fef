"""What a serving engine says about its own size: its KV cache in tokens, its KV block and
how many sequences it runs at once, read into one backend-neutral `ServerCapacity`.

Pure functions of each server's answer, so each is pinned by a test on a sample of it, and
one probe that asks a server. Where each server says it, as checked in its source:

- vLLM: `GET /metrics`, the info gauge `vllm:cache_config_info` (value 1), emitted once the
  engine has profiled its memory (`vllm/v1/metrics/loggers.py`,
  `PrometheusStatLogger.log_metrics_info("cache_config", ...)`), one sample per engine
  (label `engine`: one per data-parallel rank). Its labels are every field of `CacheConfig`
  as text, "None" when unset (`vllm/config/cache.py`, `CacheConfig.metrics_info`):
  `block_size` (tokens per KV block), `num_gpu_blocks`, and in newer versions
  `kv_cache_size_tokens` (the engine's KV capacity in tokens, counted per KV group, which
  `num_gpu_blocks * block_size` is not for hybrid models) and `kv_cache_max_concurrency`
  (requests of `max_model_len` that fit: not a sequence limit). `max_num_seqs` is a
  `SchedulerConfig` field, which has no info gauge: vLLM does not publish it.
- SGLang: `GET /server_info` (`/get_server_info` before it was renamed; kept as a
  deprecated alias) in `python/sglang/srt/entrypoints/http_server.py`: the server's
  arguments (`page_size`, `max_running_requests`, `dp_size`), the scheduler's start-up
  answer (`max_total_num_tokens`: the KV pool of one data-parallel rank in tokens;
  `Scheduler.get_init_info`) and `internal_states`, one per data-parallel rank, each with
  `effective_max_running_requests_per_dp` (the running-batch cap the scheduler settled on).
- llama.cpp `llama-server`: `GET /props` (`tools/server/server-context.cpp`, `get_props`):
  `total_slots` (`--parallel`: sequences at once) and `default_generation_settings.n_ctx`
  (one slot's context; the whole KV cache with the unified cache `-np auto` uses, a slot's
  share of it otherwise), `n_ctx` at the top level in older versions. llama.cpp has no KV
  blocks.
- Dynamo's frontend and the OpenAI API say none of this.
"""
