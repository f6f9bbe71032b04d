"""Chat logic the terminal (colibri/cli/chat.py) and the HTTP server (colibri/server/) share:
stop sequences and <think> splitting on the text stream (text, pipeline), gpt-oss's harmony
channels (harmony), and a chat request's fields and the error they raise (params). Tool calling
is colibri/toolcall/."""
