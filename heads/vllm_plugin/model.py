"""PolyheadForCausalLM: vLLM's own decoder stack plus every vocabulary head, in one engine.

The engine's vocabulary is the heads laid end to end (heads/vllm_plugin/layout.py): a global ID g of
head h is row g - off_h of h's matrix. Three places differ from a stock vLLM model:

- `embed_input_ids` looks each ID up in its head's matrix (nested heads share one, so the
  32k head's rows are the first rows of the 262k head's; no table is duplicated);
- `forward` appends one channel to the hidden states, the head index of each position's
  input token (`bucketize`). The runner slices hidden states to the sampled positions before
  `compute_logits`, and the channel travels with them: a request's next token belongs to the
  head of its current token;
- `compute_logits` multiplies each request only by its head's V_h rows and leaves -inf in
  every other head's range, so sampling can never leave the request's head; an adapted
  head adds its bias (and first maps h through its hidden adapter). The rows are cut into
  nested blocks, each multiplied once per step through vLLM's own GEMM dispatch
  (heads/vllm_plugin/nested_logits.py).

Tensor parallel: the first head matrix is the decoder's own VocabParallelEmbedding (each
rank holds its shard; lookups go through it), and the logits are vocab-parallel block by
block (nested_logits.py: each rank multiplies its 1/tp piece of every nested block, the
pieces are all-gathered). Further head matrices and adapter tensors are replicated. One
pipeline stage only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn
from vllm.config import VllmConfig
from vllm.distributed import (
    get_pp_group,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_gather,
)
from vllm.model_executor.model_loader.weight_utils import default_weight_loader

from heads.vllm_plugin.layout import CONFIG_KEY, VocabLayout
from heads.vllm_plugin.nested_logits import BlockRows, NestedLogits
from kernels import huge_pages

log = logging.getLogger(f"vllm.{__name__}")  # under vLLM's logger: its handler prints it

EMBED_TOKENS = "model.embed_tokens.weight"


def _decoder_class(model_type: str) -> type[nn.Module]:
    if model_type == "gemma3_text":
        from vllm.model_executor.models.gemma3 import Gemma3Model

        return Gemma3Model
    if model_type == "llama":
        from vllm.model_executor.models.llama import LlamaModel

        return LlamaModel
    raise ValueError(f"polyhead: no vLLM decoder for model_type {model_type!r}")


class PolyheadForCausalLM(nn.Module):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        if get_pp_group().world_size != 1:
            raise ValueError("polyhead heads support pipeline_parallel_size=1 only")
        config = vllm_config.model_config.hf_config
        # Every large mapping from here on holds this model's weights (kernels.huge_pages).
        self._mappings_before = huge_pages.mappings()
        self.layout = VocabLayout.from_json(getattr(config, CONFIG_KEY))
        self.total_vocab = self.layout.total_vocab
        self.softcap = getattr(config, "final_logit_softcapping", None)
        # The decoder sizes its embed_tokens from config.vocab_size: give it the first head
        # matrix's rows (it then *is* that matrix) instead of the concatenated ΣV_h.
        concatenated = config.vocab_size
        config.vocab_size = self.layout.matrices[0][1]
        try:
            decoder = _decoder_class(config.model_type)
            self.model = decoder(vllm_config=vllm_config, prefix=f"{prefix}model")
        finally:
            config.vocab_size = concatenated
        self.is_gemma = config.model_type == "gemma3_text"  # embeddings scale by sqrt(d)
        dtype = vllm_config.model_config.dtype
        self.head_matrices = nn.ParameterDict({
            str(i): nn.Parameter(torch.empty(rows, config.hidden_size, dtype=dtype),
                                 requires_grad=False)
            for i, (_, rows) in enumerate(self.layout.matrices) if i > 0
        })
        # Adapted heads (heads/model/adapter.py): a bias [V_h] each, and a hidden adapter's
        # D [r, d] and U [d, r]; a low-rank adapter arrives folded into its own matrix.
        def param(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)

        d = config.hidden_size
        adapted = [(str(i), h) for i, h in enumerate(self.layout.heads) if h.adapter]
        self.head_biases = nn.ParameterDict({i: param(h.vocab_size) for i, h in adapted})
        self.head_down = nn.ParameterDict({i: param(h.adapter_rank, d) for i, h in adapted
                                           if h.adapter == "hidden"})
        self.head_up = nn.ParameterDict({i: param(d, h.adapter_rank) for i, h in adapted
                                         if h.adapter == "hidden"})
        for group in (self.head_matrices, self.head_biases, self.head_down, self.head_up):
            for p in group.values():
                p.weight_loader = default_weight_loader  # type: ignore[attr-defined]
        self.register_buffer("bounds", torch.tensor(self.layout.bounds, dtype=torch.int64),
                             persistent=False)
        self.register_buffer("offsets", torch.tensor([h.offset for h in self.layout.heads],
                                                     dtype=torch.int64), persistent=False)
        self.make_empty_intermediate_tensors = self.model.make_empty_intermediate_tensors
        self.nested: NestedLogits | None = None

    def _matrix(self, i: int) -> torch.Tensor:
        return self.model.embed_tokens.weight if i == 0 else self.head_matrices[str(i)]

    def _head_index(self, input_ids: torch.Tensor) -> torch.Tensor:
        return torch.bucketize(input_ids, self.bounds, right=True)  # [T] int64

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        # input_ids: [T] global IDs -> [T, d]
        head = self._head_index(input_ids)
        local = input_ids - self.offsets[head]
        matrices = {h.embedding for h in self.layout.heads}
        if len(matrices) == 1:  # the nested case: one gather serves every head
            x = self._embed(matrices.pop(), local)
        else:
            x = torch.empty(input_ids.shape[0], self._matrix(0).shape[1],
                            dtype=self._matrix(0).dtype, device=input_ids.device)
            for i, h in enumerate(self.layout.heads):
                rows = head == i
                x[rows] = self._embed(h.embedding, local[rows])
        return x * self.model.normalizer if self.is_gemma else x

    def _embed(self, matrix: int, local: torch.Tensor) -> torch.Tensor:
        # Matrix 0 is the decoder's VocabParallelEmbedding: under TP it masks the IDs outside
        # this rank's shard and all-reduces; the others are whole on every rank.
        if matrix == 0:
            return self.model.embed_tokens(local)
        return F.embedding(local, self._matrix(matrix))

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor,
                intermediate_tensors: object = None, inputs_embeds: torch.Tensor | None = None,
                **kwargs: object) -> torch.Tensor:
        if input_ids is None:
            raise ValueError("polyhead needs token IDs to know each position's head")
        if inputs_embeds is None:
            inputs_embeds = self.embed_input_ids(input_ids)
        hidden = self.model(None, positions, intermediate_tensors, inputs_embeds, **kwargs)
        head = self._head_index(input_ids).to(hidden.dtype).unsqueeze(-1)  # [T, 1]
        return torch.cat([hidden, head], dim=-1)  # [T, d + 1]

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # hidden_states: [N, d + 1] at the sampled positions -> logits [N, ΣV_h]
        h, head = hidden_states[:, :-1], hidden_states[:, -1].round().long()
        if self.nested is None:  # first call after load_weights: the GEMM handles
            self.nested = self._nested_logits()
        return self.nested(h, head)

    def _nested_logits(self) -> NestedLogits:
        from vllm.model_executor.layers.utils import (
            dispatch_cpu_unquantized_gemm,
            dispatch_unquantized_gemm,
        )
        from vllm.platforms import current_platform

        def prepare(block: BlockRows) -> None:
            if current_platform.is_cpu():  # what stock vLLM does to its lm_head on CPU
                dispatch_cpu_unquantized_gemm(block, remove_weight=False)  # type: ignore[arg-type]

        tp = get_tensor_model_parallel_world_size()
        matrices = [self._whole_matrix(i, tp) for i in range(len(self.layout.matrices))]
        nested = NestedLogits(self.layout, matrices, dispatch_unquantized_gemm(), prepare,
                              self._finish, self._adapt, get_tensor_model_parallel_rank(), tp,
                              lambda y: tensor_model_parallel_all_gather(y, dim=-1))
        if current_platform.is_cpu():
            # The weights as loaded and packed (vLLM's and the blocks' oneDNN copies), read
            # whole every decode step, onto huge pages: something stock vLLM does not do.
            moved = huge_pages.back(huge_pages.mappings() - self._mappings_before)
            log.info("%.0f MiB of weights on huge pages", moved / 2**20)
        return nested

    def _whole_matrix(self, i: int, tp: int) -> torch.Tensor:
        """Head matrix i, every row: under TP matrix 0 is gathered once from the ranks'
        embedding shards (each rank then keeps only its pieces of the nested blocks)."""
        rows = self.layout.matrices[i][1]
        m = self._matrix(i)
        if i == 0 and tp > 1:
            m = tensor_model_parallel_all_gather(m.contiguous(), dim=0)
        return m[:rows]

    def _adapt(self, i: int, h: torch.Tensor) -> torch.Tensor:
        # h: [n, d] -> [n, d]; the hidden adapter of heads/model/adapter.py, same order
        key = str(i)
        return h + (h @ self.head_down[key].T) @ self.head_up[key].T

    def _finish(self, i: int, logits: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        # logits: [n, stop - start], head i's local columns [start, stop): bias, then softcap
        key = str(i)
        if key in self.head_biases:
            logits = logits + self.head_biases[key][start:stop]
        if not self.softcap:
            return logits
        return torch.tanh(logits / self.softcap) * self.softcap

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        extra: list[tuple[str, torch.Tensor]] = []

        def backbone() -> Iterable[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                if name.startswith("model."):
                    yield name.removeprefix("model."), tensor
                else:
                    extra.append((name, tensor))

        loaded = {f"model.{n}" for n in self.model.load_weights(backbone())}
        params = dict(self.named_parameters())
        for name, tensor in extra:
            if name not in params:
                raise ValueError(f"polyhead: unexpected tensor {name!r} in the checkpoint")
            default_weight_loader(params[name], tensor)
            loaded.add(name)
        self.nested = None  # the GEMM handles copy the rows: rebuild from the new weights
        return loaded
