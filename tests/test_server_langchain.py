"""A tool loop driven by an agent framework: LangChain's ChatOpenAI.bind_tools against
`coli serve` (the scripted engine writes the Qwen3 call, the official template renders the turns)."""
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from server_helpers import model  # noqa: F401
from test_server_tools import CALL, MID, qwen3_template, scripted  # noqa: F401


@tool
def get_weather(city: str) -> str:
    """Current weather in a city."""
    return f"sunny in {city}"


def test_bind_tools_loop(scripted):  # noqa: F811
    llm = ChatOpenAI(model=MID, base_url=scripted.proc.base + "/v1", api_key="unused", max_retries=0, timeout=30)
    bound = llm.bind_tools([get_weather])
    scripted.reply(CALL)
    history = [HumanMessage("Weather in Paris?")]
    ai = bound.invoke(history)
    assert [(c["name"], c["args"]) for c in ai.tool_calls] == [("get_weather", {"city": "Paris"})]
    history += [ai, ToolMessage(get_weather.invoke(ai.tool_calls[0]["args"]), tool_call_id=ai.tool_calls[0]["id"])]
    scripted.reply(["It is sunny."])
    answer = bound.invoke(history)
    assert answer.content == "It is sunny." and not answer.tool_calls
    sent = scripted.last_submit()["payload"]
    assert "<tool_response>\nsunny in Paris\n</tool_response>" in sent
    # LangChain sent the tool as a JSON schema derived from the Python signature
    assert '"name": "get_weather"' in sent and '"city": {"type": "string"}' in sent

    scripted.reply(CALL)  # streaming: the chunks LangChain merges into one call
    merged = None
    for chunk in bound.stream(history[:1]):
        merged = chunk if merged is None else merged + chunk
    assert [(c["name"], c["args"]) for c in merged.tool_calls] == [("get_weather", {"city": "Paris"})]
