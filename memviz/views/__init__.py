"""What a user sees: the JupyterLab widgets (`Planner`, `ChunkEditor`, `WhatIf`) and the offline HTML
report."""
