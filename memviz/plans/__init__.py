"""Budget -> plan: strategy choice, every schedule checked by `solvers.simulate`, plan documents
(`memviz.plan/3`), selective checkpointing and inference chunking plans, the plan's CD-graph."""
