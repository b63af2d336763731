"""Adapters that put a `retriever` index where users build with it: a LangChain vector store
(`integrations.langchain`, `pip install 'retriever[langchain]'`) and a Haystack document store with its retrievers
(`integrations.haystack`, `pip install 'retriever[haystack]'`). Each framework is imported only by its own module,
so importing this package needs neither; docs/frameworks.md says what maps to what."""
