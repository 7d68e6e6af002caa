"""Measuring an index and the method, from outside the server: the question-set
evaluation (`eval`, rendered by `report`), the method's agent loop with any
OpenAI-compatible model (`agent`), the forest-quality report of `ritrag inspect`
(`forest_report`) and synthetic documentation corpora for scale tests
(`synth`). Installed as `ritrag.evaluation`; it uses the server's public API
(`ritrag.serving.api.RitragIndex`, `ritrag.serving.tools`) like any client, and
nothing in the core, the jobs or the server imports it."""
