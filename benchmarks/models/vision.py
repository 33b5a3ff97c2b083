"""The corpus's CNNs (definitions in ``vision_nets.py``): ResNet-18 and MobileNetV3-small at batch 1, 3
and 8 (224x224, dynamic batch axis), and the SSDlite320-style detector on two images (one executable;
the number of detections depends on the image)."""

from __future__ import annotations

from harness import align_detections

from .common import Case
from .corpus import OnnxModel, images, onnx_group, randomize_batch_norms

BATCHES = (1, 3, 8)
SSD_LOGIT_SCALE = 12.0


def _calibration(torch, size: int):
    """A forward pass over random images of the benchmark's kind (for the BatchNorm statistics)."""
    sample = torch.from_numpy(images("calibration", 4, size))
    return lambda module: getattr(module, "features_only", module)(sample)


def _resnet(torch):
    from .vision_nets import ResNet18

    module = ResNet18()
    randomize_batch_norms(module, torch, _calibration(torch, 224))
    return module


def _mobilenet(torch):
    from .vision_nets import MobileNetV3Small

    module = MobileNetV3Small()
    randomize_batch_norms(module, torch, _calibration(torch, 224))
    return module


def _ssd(torch):
    from .vision_nets import SSDLite320

    module = SSDLite320()
    randomize_batch_norms(module, torch, _calibration(torch, 320))
    # Random class logits near zero give every class ~1/91; spread them as a trained head's are (a few
    # classes likely per box), so the score threshold and NMS have work to do.
    with torch.no_grad():
        for branch in module.classification.branches:
            branch[1].weight.mul_(SSD_LOGIT_SCALE)
    return module


def _image_cases(batches):
    return tuple(Case(f"b{n}", f"batch {n}", n, x=n) for n in batches)


def classifier(key: str, title: str, build, batches=BATCHES, exec_modes=("bytecode",)) -> OnnxModel:
    return OnnxModel(exec_modes=exec_modes,
        key=key, title=title, build=build, inputs=("images",), outputs=("logits",),
        dynamic_axes={"images": {0: "batch"}, "logits": {0: "batch"}}, tvm_shape={"images": [None, 3, 224, 224]},
        cases=_image_cases(batches), feeds=lambda case: {"images": images(key, case.units, 224)},
        atol=1e-3, rtol=1e-3,
        description="batch axis dynamic (one executable for every batch); latency per image")


RESNET18 = classifier("resnet18", "ResNet-18 (224x224, random weights)", _resnet)
# (native mode too: about 150 kernel calls of 5-100 us each, where the bytecode VM's own work is about
# 5% of a batch-1 call; ResNet-18's few long kernels leave the VM under 1%)
MOBILENET = classifier("mobilenetv3", "MobileNetV3-small (224x224, random weights)", _mobilenet,
                       exec_modes=("bytecode", "native"))
SSD = OnnxModel(
    key="ssdlite", title="SSDlite320 detector (MobileNetV3-large, NMS, 91 classes)", build=_ssd,
    inputs=("images",), outputs=("boxes", "scores", "labels"),
    dynamic_axes={"boxes": {0: "detections"}, "scores": {0: "detections"}, "labels": {0: "detections"}},
    tvm_shape={"images": [1, 3, 320, 320]},
    cases=(Case("img0", "image A", 1), Case("img1", "image B", 1)),
    feeds=lambda case: {"images": images("ssdlite", 1, 320, seed=int(case.name[-1])) * 0.25 + 0.5},
    atol=1e-3, rtol=1e-3, align=align_detections,
    description=("one 320x320 image per call; box decoding, ONNX NonMaxSuppression per class and the best "
                 "300 detections in the graph (the count depends on the image)"))


def groups(quick: bool = False) -> list:
    if quick:
        return [onnx_group(m, quick, _image_cases((1,))) for m in (RESNET18, MOBILENET)] + [
            onnx_group(SSD, quick, SSD.cases[:1])]
    return [onnx_group(m) for m in (RESNET18, MOBILENET, SSD)]
