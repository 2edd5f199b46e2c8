"""`python -m tests.heads.vllm_plugin.tp_greedy EXPORT_DIR TP`: greedy IDs of every head of a
multi-head export from one offline vLLM engine at tensor parallel size TP, as JSON on the
stdout line marked MARK. A script, not a test: vLLM spawns its TP workers, which re-import the main
module, so the engine must start under `if __name__ == "__main__"`."""

from __future__ import annotations

import json
import sys

MARK = "greedy: "  # vLLM logs to stdout too: the result line carries this mark
PROMPTS = ((5, 6, 7, 9, 11), (300, 17, 42), (1000, 3, 999, 12, 64, 7, 8))


def greedy(model: str, tp: int) -> dict[str, list[list[int]]]:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from heads.vllm_plugin.layout import CONFIG_KEY, VocabLayout

    with open(f"{model}/config.json") as f:
        layout = VocabLayout.from_json(json.load(f)[CONFIG_KEY])
    llm = LLM(model=model, skip_tokenizer_init=True, dtype="float32", tensor_parallel_size=tp,
              distributed_executor_backend="mp" if tp > 1 else None, max_model_len=64,
              max_num_seqs=len(PROMPTS) * len(layout.heads), enforce_eager=True)
    prompts = [TokensPrompt(prompt_token_ids=[h.offset + t for t in p])
               for h in layout.heads for p in PROMPTS]
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, detokenize=False)
    outs = iter(llm.generate(prompts, params, use_tqdm=False))
    return {h.name: [[t - h.offset for t in next(outs).outputs[0].token_ids] for _ in PROMPTS]
            for h in layout.heads}


if __name__ == "__main__":
    sys.stdout.write(MARK + json.dumps(greedy(sys.argv[1], int(sys.argv[2]))) + "\n")
