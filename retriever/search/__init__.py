"""The search path over one opened version: typed options (`options`), a query plan (`plan`), one searcher per
side (`dense`, `keyword`), their fusion (`fusion`, `hybrid`), per-segment top lists and their merge
(`top_lists`), and hits with their documents (`results`); `searcher.Searcher` puts them together."""
