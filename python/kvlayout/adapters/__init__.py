"""Engine adapters, pure Python and duck-typed (no engine, torch or numpy import):
:mod:`kvlayout.adapters.sglang` and :mod:`kvlayout.adapters.vllm`."""
