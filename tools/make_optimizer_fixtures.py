#!/usr/bin/env python3
"""torch.optim oracle for xmoe's Sgd and Adam: 3 steps on a [4, 6] parameter with given gradients.

Run with Debian's python3-torch: /usr/bin/python3 tools/make_optimizer_fixtures.py
Writes tests/data/optim/optimizers.json (float64 throughout).
"""
import json
import pathlib

import torch

torch.manual_seed(0)
out = []
cases = [
    ("sgd", dict(lr=0.1), torch.optim.SGD),
    ("sgd", dict(lr=0.05, momentum=0.9, weight_decay=0.01), torch.optim.SGD),
    ("adam", dict(lr=0.01, betas=(0.9, 0.999), eps=1e-8), torch.optim.Adam),
    ("adam", dict(lr=0.02, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1), torch.optim.AdamW),
]
for kind, opts, cls in cases:
    w0 = torch.randn(4, 6, dtype=torch.float64)
    grads = [torch.randn(4, 6, dtype=torch.float64) for _ in range(3)]
    p = torch.nn.Parameter(w0.clone())
    opt = cls([p], **opts)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    flat = dict(opts)
    if "betas" in flat:
        flat["beta1"], flat["beta2"] = flat.pop("betas")
    out.append(dict(kind=kind, options=flat, initial=w0.flatten().tolist(),
                    grads=[g.flatten().tolist() for g in grads], expected=p.detach().flatten().tolist()))
path = pathlib.Path(__file__).resolve().parent.parent / "tests/data/optim/optimizers.json"
path.write_text(json.dumps(out, indent=1))
print("wrote", path)
