"""`coli detokenize IDS --model M`: comma-separated token ids back into text, by the engine's
tokenizer tool (the flags are tokenize's)."""
from colibri.cli.tokenizer_tool import TAKES_REST, add_arguments, tokenizer_tool  # noqa: F401

HELP = "turn comma-separated token ids back into text"


def run(args):
    return tokenizer_tool(args, "detokenize")
