"""``python -m toy``: the toy model's folder (built if needed), or ``--write_data DIR``: the two splits as jsonl."""

import toy

raise SystemExit(toy.main())
