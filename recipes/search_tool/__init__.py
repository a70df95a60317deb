"""Search-tool RL: answer questions about an invented encyclopedia with a BM25 search tool
(``python -m recipes.search_tool.train``)."""
