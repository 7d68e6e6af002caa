"""What the metadata step (docs/METADATA.md) would send for an index: the
prompt tokens of every node it would describe, counted, not estimated.

    python -m benchmarks.metadata_cost INDEX [--label NAME]

Every live node that holds text is turned into the request the stage sends
(`transforms.metadata.enrich.metadata_request`: the versioned system prompt,
the title path, the first MAX_BODY_CHARS characters of the body) and its
messages are counted in o200k_base (serving.outline.TOKENIZER; a Qwen, Llama or
Claude tokenizer counts somewhat differently). Reported: nodes, nodes
described, prompt tokens per 1,000 described nodes (median and 90th percentile
per node too), the answer tokens the stage allows per request
(--metadata_max_answer_tokens, the bound on output), and the budget's own
estimate (characters / 3 + that bound), which --metadata_max_tokens spends.
No model is called: what this measures is the input side of the cost.
"""
from __future__ import annotations

import argparse
import dataclasses
import shlex
import statistics
import sys

from benchmarks.results import cpu_description, write_section
from ritrag.reader import IndexReader
from ritrag.serving.outline import count_tokens
from ritrag.transforms.metadata.enrich import describable, estimated_tokens, metadata_request
from ritrag.transforms.metadata.openai_compatible import EndpointConfig



def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("index")
    parser.add_argument("--label", default="", help="what the index holds, for the section title")
    args = parser.parse_args(argv)
    max_answer = next(f.default for f in dataclasses.fields(EndpointConfig) if f.name == "max_answer_tokens")
    nodes, tokens, estimates = 0, [], 0
    for node in IndexReader(args.index).rows("nodes"):
        nodes += 1
        if not describable(node):
            continue
        request = metadata_request("", node)
        tokens.append(sum(count_tokens(m["content"]) for m in request.messages()))
        estimates += estimated_tokens(request, max_answer)
    described = len(tokens)
    per_1000 = 1000 * sum(tokens) / described if described else 0.0
    deciles = statistics.quantiles(tokens, n=10) if described > 1 else [0.0] * 9
    lines = [
        f"## Metadata prompts, counted (benchmarks/metadata_cost.py): {args.label or args.index}",
        "",
        f"Machine: {cpu_description()}. Command: `python -m benchmarks.metadata_cost "
        f"{shlex.join(argv or sys.argv[1:])}`. Tokens: o200k_base; no model called.",
        "",
        f"- nodes {nodes:,}, described (hold text) {described:,}",
        f"- prompt tokens per 1,000 described nodes: {per_1000:,.0f} (per node: median "
        f"{statistics.median(tokens) if tokens else 0:,.0f}, 90th percentile {deciles[8]:,.0f})",
        f"- answer tokens allowed per request: {max_answer:,} (at most {max_answer * 1000:,} per 1,000 nodes)",
        f"- the budget's estimate (--metadata_max_tokens spends it): {1000 * estimates / max(described, 1):,.0f} "
        f"per 1,000 nodes, prompt and answer bound together",
    ]
    write_section("benchmarks/metadata_cost.py", args.label or args.index, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
