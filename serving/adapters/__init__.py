"""GetToC and Read for agent frameworks: one module per framework (langchain,
llamaindex, openai_agents), each importing its library, all over the one
backend contract of `ritrag.serving.adapters.base` (the local `ToolService`
or a `ritrag serve` over HTTP). Importing this package imports no framework."""
