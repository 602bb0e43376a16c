"""Dataset rows to verdicts: each row's rollout Job rendered as agent-lightning renders it (render,
slots), judged with the decision (judge), and what the judged rows give (judged, records)."""
