"""Weight versions that mean something: the fence a trainer drives around a weight
update (``WeightFence``), the control topic it and every gateway replica follow,
and the loader that puts new weights into a running vLLM (``weights.vllm``).
The page docs/weights.md is the guide."""

from stream_export.weights.fence import WeightFence

__all__ = ["WeightFence"]
