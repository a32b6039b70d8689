"""Compatibility layers: other projects' names over mcp-durable's parts.

- `promptise`: the process API of the durable-execution design this project grew from
  (`FileJournal(base_path=…)`, `JournalEntry`, `ReplayEngine`), over our journals.
"""
