"""`coli tokenize TEXT --model M`: the engine's tokenizer tool on the model's tokenizer.json;
`coli detokenize` (colibri/cli/detokenize.py) runs its other direction."""
from colibri.cli.tokenizer_tool import TAKES_REST, add_arguments, tokenizer_tool  # noqa: F401

HELP = "tokenize text with the model's tokenizer.json"


def run(args):
    return tokenizer_tool(args, "tokenize")
