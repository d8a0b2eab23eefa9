"""Front doors of the pipeline stages: `reveal analyze`, `reveal baseline`, `reveal report`
(the top layer: they may import every stage below them, no stage imports them)."""
