"""What rufus adds inside vLLM's worker processes (model.json ``worker_extension_cls``:
``rufus.vllm_worker.extension.WorkerExtension``): the AOT compile-cache fix, the short
compile warm-up, and the ``rufus_int8`` registration, in every worker, followers included."""
