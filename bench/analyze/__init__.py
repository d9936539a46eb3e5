"""From records to verdicts: statistics, analysis, findings, summaries, comparisons, cost."""
