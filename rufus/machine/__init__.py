"""The machine layer: what this machine is (``cpu``), where what we build lives (``caches``,
``fingerprint``), the precision chosen by measuring it (``precision``), and the int8 kernel
built for its CPU with vLLM's ``rufus_int8`` method over it (``int8_kernel``, ``vllm_int8``).
Every role reads it (setup, the Triton stub, followers, vLLM's workers); it imports only
the vocabulary (docs/architecture.md, "Layers")."""
