"""Tutel's helloworld on xmoe's layer: `python -m xmoe.examples.helloworld` with Tutel's flags.

x = randn [batch_size, num_tokens, model_dim] (seed 0); out = log_softmax(sum over model_dim of moe(x)) over
tokens; NLL against label 0; SGD. Prints Tutel's lines: [Statistics], [Benchmark], one `STEP-i: loss = ...,
step_time = ... sec, perf = ... tflops.` per step and the [Summary] average over the last 10 steps. CPU;
--num_steps defaults to 5 (as `xmoe bench`), Tutel's 100 take long on a CPU.

Under `mpirun -np W python -m xmoe.examples.helloworld` the experts are split over the W ranks
(--num_local_experts per rank, or a negative count to shard each expert over that many ranks); rank 0 prints
the lines, as Tutel's dist_print; the gate's gradients are averaged over the ranks before each step
(--allreduce_degree -1 skips it), as Tutel's example.
"""

import argparse
import os
import time

import torch
import torch.nn.functional as F

from xmoe import moe as tutel_moe
from xmoe import net


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--num_tokens", type=int, default=512)
    parser.add_argument("--model_dim", type=int, default=2048)
    parser.add_argument("--hidden_size", type=int, default=2048)
    parser.add_argument("--num_local_experts", type=int, default=2)
    parser.add_argument("--dtype", type=str, default="float32")
    parser.add_argument("--fp32_gate", default=False, action="store_true")
    parser.add_argument("--top", type=int, default=2)
    parser.add_argument("--l_aux_wt", type=float, default=0.0)
    parser.add_argument("--a2a_ffn_overlap_degree", type=int, default=1)
    parser.add_argument("--allreduce_degree", type=int, default=1)
    parser.add_argument("--num_steps", type=int, default=5)
    parser.add_argument("--parallel_type", type=str, default="adaptive:1")
    parser.add_argument("--checkpoint_path", type=str, default="")
    parser.add_argument("--device", type=str, default="cpu")
    parser.add_argument("--use_2dh", default=False, action="store_true")
    parser.add_argument("--eval", default=False, action="store_true")
    parser.add_argument("--capacity_factor", type=float, default=1.0)  # 0: dropless; < 0: capped dropless
    parser.add_argument("--megablocks_size", type=int, default=0)
    parser.add_argument("--use_tensorcore", default=False, action="store_true")  # no effect on CPU
    parser.add_argument("--expert_type", type=str, default="ffn", choices=["ffn", "swiglu"])
    parser.add_argument("--lr", type=float, default=1e-4)
    args = parser.parse_args(argv)

    if args.device != "cpu":
        raise SystemExit(f"--device {args.device}: xmoe's layer runs on the CPU only (no CUDA backend yet)")
    dtypes = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}
    if args.dtype not in dtypes:
        raise SystemExit(f"--dtype {args.dtype}: xmoe runs float32, bfloat16 and float64")
    torch.set_default_dtype(dtypes[args.dtype])
    dist_world_size = net.launched_world_size()
    dist_rank = net.world().rank if dist_world_size > 1 else 0

    def dist_print(*values):
        if dist_rank == 0:
            print(*values, flush=True)
    batch_size, num_tokens, model_dim = args.batch_size, args.num_tokens, args.model_dim
    hidden_size, num_local_experts, top_value = args.hidden_size, args.num_local_experts, args.top
    device = torch.device("cpu")

    class ExampleModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            experts = {"type": args.expert_type, "count_per_node": num_local_experts,
                       "hidden_size_per_expert": hidden_size}
            if args.expert_type == "ffn":
                experts["activation_fn"] = lambda x: F.relu(x)
            self._moe_layer = tutel_moe.moe_layer(
                gate_type={"type": "top", "k": top_value, "fp32_gate": args.fp32_gate,
                           "capacity_factor": args.capacity_factor},
                experts=experts,
                model_dim=model_dim,
                scan_expert_func=lambda name, param: setattr(param, "skip_allreduce", True),
                seeds=(1, dist_rank + 1, 1),
                a2a_ffn_overlap_degree=args.a2a_ffn_overlap_degree,
                parallel_type=args.parallel_type,
                use_2dh=args.use_2dh,
            )
            local_count = sum(torch.numel(p) for _, p in self._moe_layer.get_parameter_iterator("local_experts"))
            shared_count = sum(torch.numel(p) for _, p in self._moe_layer.get_parameter_iterator("gate"))
            dist_print("[Statistics] param count for MoE local_experts = %s, param count for MoE gate = %s.\n" %
                       (local_count, shared_count))

        def forward(self, input):
            result = self._moe_layer(input, megablocks_size=args.megablocks_size)
            return F.log_softmax(torch.sum(result, dim=2), dim=1)

    model = ExampleModel().to(device)
    dist_print(model)
    if args.checkpoint_path:
        path = args.checkpoint_path.replace("{rank}", str(dist_rank)).replace("{size}", str(dist_world_size))
        if os.path.exists(path):
            model.load_state_dict(torch.load(path))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

    torch.manual_seed(0)
    x = torch.randn([batch_size, num_tokens, model_dim], dtype=torch.float32).to(torch.get_default_dtype())
    y = torch.LongTensor(batch_size).random_(1)

    dist_print("[Benchmark] world_size = %s, dtype = %s, model_dim = %s, hidden_size = %s, samples = %s, "
               "num_local_experts = %s, topK = %s, a2a_ffn_overlap_degree = %s, device = `%s`" %
               (dist_world_size, args.dtype, model_dim, hidden_size, batch_size * num_tokens, num_local_experts,
                top_value, args.a2a_ffn_overlap_degree, device))

    average_time, num_steps = 0, args.num_steps
    num_global_experts = tutel_moe.moe_layer.global_expert_count(num_local_experts)
    for i in range(num_steps):
        t_start = time.perf_counter()
        if not args.eval:
            optimizer.zero_grad()
            output = model(x)
            loss = F.nll_loss(output, y)
            if args.l_aux_wt:
                loss += args.l_aux_wt * model._moe_layer.l_aux
            loss.backward()
            if dist_world_size > 1 and args.allreduce_degree != -1:
                for p in model.parameters():
                    if not hasattr(p, "skip_allreduce"):
                        p.grad = net.simple_all_reduce(p.grad / dist_world_size)
            optimizer.step()
        else:
            with torch.no_grad():
                output = model(x)
                loss = F.nll_loss(output, y)
        t_stop = time.perf_counter()
        mm_ceof, cap_ceof = 1 if args.eval else 3, min(args.top, num_global_experts)
        tflops = (batch_size * num_tokens * model_dim * hidden_size) * 4 * mm_ceof * cap_ceof * 1e-12 / \
            (t_stop - t_start)
        dist_print("STEP-%s: loss = %.5f, step_time = %.6f sec, perf = %.2f tflops." %
                   (i, float(loss.data), t_stop - t_start, tflops))
        if i + 10 >= num_steps:
            average_time += t_stop - t_start
    average_time /= 10
    dist_print("\n[Summary] Average synchronized step_time = %s sec." % average_time)
    if args.checkpoint_path:
        torch.save(model.state_dict(), path)


if __name__ == "__main__":
    main()
