"""The corpus's CNNs in plain PyTorch (torchvision does not import beside the pinned torch): ResNet-18,
MobileNetV3 (small; large with the reduced tail as an SSDlite backbone) and an SSDlite320-style detector
with its anchors, box decoding and NMS. The layers are torchvision's (BasicBlock, inverted residual with
squeeze-excitation and hardswish, SSDlite's depthwise extra blocks and heads, (10, 10, 5, 5) box coder,
score threshold 0.001, IoU 0.55, 300 detections); the code is written here. Imported only by PyTorch
processes (``prepare`` and the PyTorch worker).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F


# --- ResNet-18 ---------------------------------------------------------------------------------------
class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + identity)


class ResNet18(nn.Module):
    def __init__(self, classes: int = 1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        layers, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers.append(nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)))
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = self.layers(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# --- MobileNetV3 -------------------------------------------------------------------------------------
def make_divisible(value: float, divisor: int = 8) -> int:
    """The channel count rounded to a multiple of ``divisor``, never below 90% of ``value``."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


def conv_bn_act(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1, act=nn.Hardswish,
                eps: float = 1e-3) -> nn.Sequential:
    layers = [nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
              nn.BatchNorm2d(cout, eps=eps)]
    if act is not None:
        layers.append(act())
    return nn.Sequential(*layers)


class SqueezeExcitation(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        squeeze = make_divisible(channels // 4)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)

    def forward(self, x):
        scale = F.adaptive_avg_pool2d(x, 1)
        return x * F.hardsigmoid(self.fc2(F.relu(self.fc1(scale))))


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, kernel: int, expanded: int, cout: int, se: bool, act: str, stride: int):
        super().__init__()
        activation = nn.Hardswish if act == "HS" else nn.ReLU
        layers = []
        if expanded != cin:
            layers.append(conv_bn_act(cin, expanded, 1, act=activation))
        layers.append(conv_bn_act(expanded, expanded, kernel, stride, groups=expanded, act=activation))
        if se:
            layers.append(SqueezeExcitation(expanded))
        layers.append(conv_bn_act(expanded, cout, 1, act=None))
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        out = self.block(x)
        return out + x if self.residual else out


#: (input channels, kernel, expanded channels, output channels, squeeze-excitation, activation, stride)
SMALL = ((16, 3, 16, 16, True, "RE", 2), (16, 3, 72, 24, False, "RE", 2), (24, 3, 88, 24, False, "RE", 1),
         (24, 5, 96, 40, True, "HS", 2), (40, 5, 240, 40, True, "HS", 1), (40, 5, 240, 40, True, "HS", 1),
         (40, 5, 120, 48, True, "HS", 1), (48, 5, 144, 48, True, "HS", 1), (48, 5, 288, 96, True, "HS", 2),
         (96, 5, 576, 96, True, "HS", 1), (96, 5, 576, 96, True, "HS", 1))


def large_settings(reduce: int = 1) -> tuple:
    """MobileNetV3-large's blocks; ``reduce=2`` halves the last stage (SSDlite's reduced tail)."""
    c5, e5 = 160 // reduce, 960 // reduce
    return ((16, 3, 16, 16, False, "RE", 1), (16, 3, 64, 24, False, "RE", 2), (24, 3, 72, 24, False, "RE", 1),
            (24, 5, 72, 40, True, "RE", 2), (40, 5, 120, 40, True, "RE", 1), (40, 5, 120, 40, True, "RE", 1),
            (40, 3, 240, 80, False, "HS", 2), (80, 3, 200, 80, False, "HS", 1), (80, 3, 184, 80, False, "HS", 1),
            (80, 3, 184, 80, False, "HS", 1), (80, 3, 480, 112, True, "HS", 1), (112, 3, 672, 112, True, "HS", 1),
            (112, 5, 672, c5, True, "HS", 2), (c5, 5, e5, c5, True, "HS", 1), (c5, 5, e5, c5, True, "HS", 1))


def mobilenet_features(settings) -> nn.Sequential:
    """The stem, the inverted residual blocks and the last 1x1 convolution (6x the last width)."""
    layers = [conv_bn_act(3, settings[0][0], 3, 2)]
    layers += [InvertedResidual(*s) for s in settings]
    layers.append(conv_bn_act(settings[-1][3], 6 * settings[-1][3], 1))
    return nn.Sequential(*layers)


class MobileNetV3Small(nn.Module):
    def __init__(self, classes: int = 1000):
        super().__init__()
        self.features = mobilenet_features(SMALL)
        self.classifier = nn.Sequential(nn.Linear(576, 1024), nn.Hardswish(), nn.Dropout(0.2), nn.Linear(1024, classes))

    def forward(self, x):
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


# --- SSDlite320 --------------------------------------------------------------------------------------
class NonMaxSuppression(torch.autograd.Function):
    """ONNX ``NonMaxSuppression`` (corner boxes): exported as that node; in eager mode the same greedy
    selection per (image, class), in NumPy (torchvision's NMS is C++, unavailable here)."""

    @staticmethod
    def forward(ctx, boxes, scores, max_per_class: int, iou_threshold: float, score_threshold: float):
        return torch.from_numpy(nms_reference(boxes.numpy(), scores.numpy(), max_per_class, iou_threshold,
                                              score_threshold))

    @staticmethod
    def symbolic(g, boxes, scores, max_per_class, iou_threshold, score_threshold):
        def const(value, dtype):
            return g.op("Constant", value_t=torch.tensor([value], dtype=dtype))

        return g.op("NonMaxSuppression", boxes, scores, const(max_per_class, torch.int64),
                    const(iou_threshold, torch.float32), const(score_threshold, torch.float32))


def nms_reference(boxes: np.ndarray, scores: np.ndarray, max_per_class: int, iou_threshold: float,
                  score_threshold: float) -> np.ndarray:
    """``(selected, 3)`` int64 rows ``[image, class, box]`` as ONNX's ``NonMaxSuppression``: per image
    and class, boxes scoring above the threshold in descending score order, each kept unless its IoU
    with a kept box exceeds ``iou_threshold``, at most ``max_per_class``."""
    rows = []
    for b in range(scores.shape[0]):
        corners = boxes[b].astype(np.float64)
        low, high = np.minimum(corners[:, :2], corners[:, 2:]), np.maximum(corners[:, :2], corners[:, 2:])
        area = np.prod(high - low, axis=1)
        for c in range(scores.shape[1]):
            candidates = np.flatnonzero(scores[b, c] > score_threshold)
            order = candidates[np.argsort(-scores[b, c, candidates], kind="stable")]
            # IoU of every pair of candidates at once; then the greedy pass over them in score order
            inter = np.prod(np.clip(np.minimum(high[order, None], high[None, order])
                                    - np.maximum(low[order, None], low[None, order]), 0, None), axis=2)
            union = area[order, None] + area[None, order] - inter
            iou = np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)
            suppressed = np.zeros(len(order), bool)
            kept = 0
            for j in range(len(order)):
                if suppressed[j]:
                    continue
                rows.append((b, c, int(order[j])))
                kept += 1
                if kept == max_per_class:
                    break
                suppressed |= iou[j] > iou_threshold
    return np.asarray(rows, np.int64).reshape(-1, 3)


def extra_block(cin: int, cout: int) -> nn.Sequential:
    mid = cout // 2
    return nn.Sequential(conv_bn_act(cin, mid, 1, act=nn.ReLU6), conv_bn_act(mid, mid, 3, 2, groups=mid, act=nn.ReLU6),
                         conv_bn_act(mid, cout, 1, act=nn.ReLU6))


class SSDLiteHead(nn.Module):
    """Per feature map: a depthwise 3x3 convolution (BN, ReLU6) and a 1x1 convolution to
    ``anchors * width`` values; the maps' outputs concatenated to ``(batch, boxes, width)``."""

    def __init__(self, channels, anchors: int, width: int):
        super().__init__()
        self.width = width
        self.branches = nn.ModuleList(
            nn.Sequential(conv_bn_act(c, c, 3, groups=c, act=nn.ReLU6), nn.Conv2d(c, anchors * width, 1))
            for c in channels)

    def forward(self, features):
        outputs = []
        for branch, x in zip(self.branches, features):
            y = branch(x)
            n, _, h, w = y.shape
            outputs.append(y.view(n, -1, self.width, h, w).permute(0, 3, 4, 1, 2).reshape(n, -1, self.width))
        return torch.cat(outputs, 1)


def ssd_anchors(sizes, image: int, min_ratio: float = 0.2, max_ratio: float = 0.95,
                aspect_ratios=(2, 3)) -> np.ndarray:
    """Default boxes ``(boxes, 4)`` as ``(cx, cy, w, h)`` in pixels, feature-map cell by cell (row-major),
    6 per cell: scale s_k, sqrt(s_k s_k+1) and s_k * sqrt(r), s_k / sqrt(r) both ways for r in 2, 3."""
    m = len(sizes)
    scales = [min_ratio + (max_ratio - min_ratio) * k / (m - 1) for k in range(m)] + [1.0]
    out = []
    for k, f in enumerate(sizes):
        s, s_next = scales[k], math.sqrt(scales[k] * scales[k + 1])
        shapes = [(s, s), (s_next, s_next)]
        for r in aspect_ratios:
            shapes += [(s * math.sqrt(r), s / math.sqrt(r)), (s / math.sqrt(r), s * math.sqrt(r))]
        wh = np.clip(np.asarray(shapes), 0, 1)
        centers = (np.arange(f) + 0.5) / f
        cy, cx = np.meshgrid(centers, centers, indexing="ij")
        cells = np.stack([cx.ravel(), cy.ravel()], 1)
        boxes = np.concatenate([np.repeat(cells, len(wh), 0), np.tile(wh, (len(cells), 1))], 1)
        out.append(boxes)
    return (np.concatenate(out) * image).astype(np.float32)


class SSDLite320(nn.Module):
    """SSDlite320 on a MobileNetV3-large backbone (reduced tail), 91 classes, one image per call:
    returns ``boxes (n, 4)`` (xyxy pixels), ``scores (n,)`` and ``labels (n,)`` of up to 300 detections.
    Postprocessing as torchvision's: softmax, per class the 300 best boxes, NMS per class (IoU 0.55,
    scores above 0.001), the 300 best of all that NMS kept."""

    IMAGE = 320
    SCORE_THRESHOLD, IOU_THRESHOLD, TOPK_CANDIDATES, DETECTIONS = 0.001, 0.55, 300, 300
    BOX_WEIGHTS = (10.0, 10.0, 5.0, 5.0)

    def __init__(self, classes: int = 91):
        super().__init__()
        features = mobilenet_features(large_settings(reduce=2))
        c4 = 13  # the stride-16 block whose expansion output is the first feature map
        self.stage1 = nn.Sequential(*features[:c4], features[c4].block[0])
        self.stage2 = nn.Sequential(*features[c4].block[1:], *features[c4 + 1:])
        self.extras = nn.ModuleList(extra_block(a, b) for a, b in ((480, 512), (512, 256), (256, 256), (256, 128)))
        channels = (672, 480, 512, 256, 256, 128)
        self.classification = SSDLiteHead(channels, 6, classes)
        self.regression = SSDLiteHead(channels, 6, 4)
        sizes = (20, 10, 5, 3, 2, 1)
        self.register_buffer("anchors", torch.from_numpy(ssd_anchors(sizes, self.IMAGE)))

    def decode(self, deltas):
        """Box coder with weights (10, 10, 5, 5), clipped to the image: ``(batch, boxes, 4)`` xyxy."""
        a = self.anchors
        wx, wy, ww, wh = self.BOX_WEIGHTS
        dw = torch.clamp(deltas[..., 2] / ww, max=math.log(1000.0 / 16))
        dh = torch.clamp(deltas[..., 3] / wh, max=math.log(1000.0 / 16))
        cx = deltas[..., 0] / wx * a[:, 2] + a[:, 0]
        cy = deltas[..., 1] / wy * a[:, 3] + a[:, 1]
        w, h = torch.exp(dw) * a[:, 2], torch.exp(dh) * a[:, 3]
        boxes = torch.stack([cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h], -1)
        return torch.clamp(boxes, 0.0, float(self.IMAGE))

    def features_only(self, images):
        """The class logits and box deltas of every anchor (no postprocessing)."""
        x = (images - 0.5) / 0.5
        c4 = self.stage1(x)
        features = [c4, self.stage2(c4)]
        for block in self.extras:
            features.append(block(features[-1]))
        return self.classification(features), self.regression(features)

    def forward(self, images):
        logits, deltas = self.features_only(images)
        boxes = self.decode(deltas)
        scores = torch.softmax(logits[0], -1)[:, 1:].t()  # (classes - 1, boxes): one image
        # per class the TOPK_CANDIDATES best boxes, then NMS per class (the classes as NMS's batch axis)
        candidates, index = torch.topk(scores, self.TOPK_CANDIDATES, dim=1)
        candidate_boxes = boxes[0][index]  # (classes - 1, candidates, 4)
        selected = NonMaxSuppression.apply(candidate_boxes, candidates.unsqueeze(1), self.TOPK_CANDIDATES,
                                           self.IOU_THRESHOLD, self.SCORE_THRESHOLD)
        c, i = selected[:, 0], selected[:, 2]
        det_scores = candidates[c, i]
        # the best DETECTIONS of what NMS kept (k read from the shape, so the export keeps it dynamic)
        count = torch._shape_as_tensor(det_scores)[0:1]
        k = torch.min(torch.cat([count, torch.tensor([self.DETECTIONS])]))
        top_scores, order = torch.topk(det_scores, k)  # type: ignore[arg-type]
        return candidate_boxes[c[order], i[order]], top_scores, c[order] + 1
