#!/usr/bin/env python3
"""The classification server a user would write instead of tost_server: grpcio with a thread pool,
the same tost.v1 Classify API, the same model and weights (models/<name>: config.json +
model.safetensors, loaded by tools/tost_reference.py) run in PyTorch eager (--device: the CPU or a
CUDA GPU), one forward per request
(no cross-request batching), probabilities by softmax, top-k labels.

It also answers ListModels and ModelInfo for its one model, so tost_loadgen discovers the input
shape the same way it does against tost_server. Prints "python_classify_server listening on
127.0.0.1:PORT" once serving (--port=0 picks a free port), like tost_server.

Example: python tools/bench/python_classify_server.py --model-dir models/tost-digits --port 0
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from concurrent import futures

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", default=os.path.join(benchlib.ROOT, "models", "tost-digits"))
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--workers", type=int, default=4, help="gRPC thread pool size")
    ap.add_argument("--device", default="cpu", help="where the model runs: cpu or cuda[:N]")
    ap.add_argument("--torch-threads", type=int, default=0,
                    help="torch intra-op threads; 0: one per core this process may run on")
    args = ap.parse_args()

    torch.set_num_threads(args.torch_threads or len(os.sched_getaffinity(0)))
    import grpc

    pb2, pb2_grpc = benchlib.proto_modules()
    R = benchlib.reference()
    model, config = R.load_model(args.model_dir)
    device = torch.device(args.device)
    model = model.to(device)
    vision = config["vision"]
    name = config["name"]
    shape = (vision["in_chans"], vision["image_height"], vision["image_width"])
    labels = config.get("labels") or [str(i) for i in range(vision["num_classes"])]
    with torch.inference_mode():  # first call allocates; not part of any request
        model(torch.zeros((1, *shape), device=device))

    status = pb2.ModelStatus(name=name, version=config.get("version", ""), architecture="tost_vision",
                             ready=True, trained=bool(config.get("trained")), input_shape=list(shape),
                             num_classes=vision["num_classes"], device=str(device), dtype="fp32")

    class Servicer(pb2_grpc.TostServicer):
        def Classify(self, request, context):
            if request.model and request.model != name:
                context.abort(grpc.StatusCode.NOT_FOUND, f"model {request.model!r}: this server has {name!r}")
            t = request.tensor
            dims = list(t.shape)
            if len(dims) == 3:
                dims = [1] + dims
            if len(dims) != 4 or tuple(dims[1:]) != shape:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"tensor: expected [B,{shape[0]},{shape[1]},{shape[2]}], got {list(t.shape)}")
            if t.raw:
                x = torch.from_numpy(np.frombuffer(t.raw, dtype="<f4").copy())
            else:
                x = torch.tensor(list(t.data), dtype=torch.float32)
            if x.numel() != int(np.prod(dims)):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"tensor: {x.numel()} values for shape {dims}")
            x = x.view(dims).to(device)
            with torch.inference_mode():
                probs = torch.softmax(model(x), dim=-1).cpu()
            k = min(max(request.top_k or 5, 1), probs.shape[1])
            top = torch.topk(probs, k, dim=-1)
            response = pb2.ClassifyResponse(model=name)
            for values, indices in zip(top.values.tolist(), top.indices.tolist()):
                response.results.append(pb2.Classification(labels=[
                    pb2.Label(index=i, label=labels[i], probability=p) for p, i in zip(values, indices)]))
            return response

        def ListModels(self, request, context):
            return pb2.ListModelsResponse(models=[status])

        def ModelInfo(self, request, context):
            if request.model != name:
                context.abort(grpc.StatusCode.NOT_FOUND, f"model {request.model!r}: this server has {name!r}")
            return status

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=args.workers),
                         options=[("grpc.max_receive_message_length", 64 << 20)])
    pb2_grpc.add_TostServicer_to_server(Servicer(), server)
    port = server.add_insecure_port(f"{args.host}:{args.port}")
    server.start()
    print(f"python_classify_server listening on {args.host}:{port}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    server.stop(grace=5).wait()


if __name__ == "__main__":
    main()
