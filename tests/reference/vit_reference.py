"""vit_reference.py - a small PyTorch Vision Transformer, the ground truth for vithost's vit plugin.

It reproduces timm's VisionTransformer (timm/models/vision_transformer.py) for the subset vithost
implements, with timm's structure, numerics and state_dict names, so that a timm checkpoint's
tensors map one to one onto the plugin's parameter table:

    cls_token                 (1, 1, D)        only with classifier "token"
    pos_embed                 (1, N, D)        N = patches (+1 with a class token)
    patch_embed.proj.weight   (D, C, P, P)     Conv2d, stride P
    patch_embed.proj.bias     (D,)
    blocks.{i}.norm1.weight / .bias            (D,)
    blocks.{i}.attn.qkv.weight (3D, D), .bias (3D,)
    blocks.{i}.attn.proj.weight (D, D), .bias (D,)
    blocks.{i}.norm2.weight / .bias            (D,)
    blocks.{i}.mlp.fc1.weight (M, D), .bias (M,)
    blocks.{i}.mlp.fc2.weight (D, M), .bias (D,)
    norm.weight / .bias       (D,)             classifier "token": final norm, head on token 0
    fc_norm.weight / .bias    (D,)             classifier "pooled": mean over tokens, then fc_norm
    head.weight (classes, D), head.bias (classes,)

"pooled" is timm's global_pool='avg' with class_token=False, where timm replaces `norm` by an
Identity and uses `fc_norm` after the mean. Blocks are pre-norm:
    x = x + attn(norm1(x));  x = x + mlp(norm2(x))
LayerNorm eps 1e-6, GELU exact (erf), attention: qkv reshaped (B, N, 3, H, Dh), q scaled by
Dh**-0.5, softmax over keys, heads concatenated, proj. Dropout and drop_path are not modelled
(the fixtures use 0). Loss: nn.CrossEntropyLoss(label_smoothing=s), mean over the batch.

layout "batch_second" runs the blocks on (N, B, D) activations instead of (B, N, D). It is the
same function (the tests prove it gives the same numbers); it exists so a fixture can be computed
through the layout the C plugin will run in.

Run with Debian's PyTorch: /usr/bin/python3 (torch 1.13, CPU). timm itself is not needed.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

LAYOUTS = ("batch_first", "batch_second")
CLASSIFIERS = ("token", "pooled")
QKV_STD = 0.1  # see init_params


class PatchEmbed(nn.Module):
    """(B, C, H, W) -> (B, num_patches, D), patches in row-major order, as timm's PatchEmbed."""

    def __init__(self, img_size, patch_size, in_chans, embed_dim):
        super().__init__()
        height, width = img_size
        if height % patch_size or width % patch_size:
            raise ValueError(f"image {height}x{width} is not a multiple of patch {patch_size}")
        self.grid_size = (height // patch_size, width // patch_size)
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


class Attention(nn.Module):
    def __init__(self, dim, num_heads):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim {dim} is not a multiple of heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=True)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x, batch_second=False):
        if batch_second:
            N, B, D = x.shape
            # (N, B, 3, H, Dh) -> (3, B, H, N, Dh)
            qkv = self.qkv(x).reshape(N, B, 3, self.num_heads, self.head_dim).permute(2, 1, 3, 0, 4)
        else:
            B, N, D = x.shape
            # (B, N, 3, H, Dh) -> (3, B, H, N, Dh), exactly timm's Attention
            qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q = q * self.scale
        attn = (q @ k.transpose(-2, -1)).softmax(dim=-1)
        x = attn @ v  # (B, H, N, Dh)
        if batch_second:
            x = x.permute(2, 0, 1, 3).reshape(N, B, D)
        else:
            x = x.transpose(1, 2).reshape(B, N, D)
        return self.proj(x)


class Mlp(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()  # approximate='none': erf
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim, num_heads, mlp_dim, eps):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.attn = Attention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = Mlp(dim, mlp_dim)

    def forward(self, x, batch_second=False):
        x = x + self.attn(self.norm1(x), batch_second)
        x = x + self.mlp(self.norm2(x))
        return x


class VisionTransformer(nn.Module):
    """timm's VisionTransformer for class_token/global_pool in {(True, 'token'), (False, 'avg')}."""

    def __init__(self, image_height, image_width, channels, patch_size, dim, depth, heads,
                 mlp_dim, num_classes, classifier="token", layout="batch_first", eps=1e-6):
        super().__init__()
        if classifier not in CLASSIFIERS:
            raise ValueError(f"classifier {classifier!r} not in {CLASSIFIERS}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout {layout!r} not in {LAYOUTS}")
        self.classifier = classifier
        self.layout = layout
        self.num_prefix_tokens = 1 if classifier == "token" else 0
        # Module creation order follows timm; state_dict lists direct parameters
        # (cls_token, pos_embed) first, then submodules in this order.
        self.patch_embed = PatchEmbed((image_height, image_width), patch_size, channels, dim)
        num_tokens = self.patch_embed.num_patches + self.num_prefix_tokens
        if classifier == "token":
            self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        else:
            self.cls_token = None
        self.pos_embed = nn.Parameter(torch.zeros(1, num_tokens, dim))
        self.blocks = nn.Sequential(*[Block(dim, heads, mlp_dim, eps) for _ in range(depth)])
        use_fc_norm = classifier == "pooled"
        self.norm = nn.LayerNorm(dim, eps=eps) if not use_fc_norm else nn.Identity()
        self.fc_norm = nn.LayerNorm(dim, eps=eps) if use_fc_norm else nn.Identity()
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.patch_embed(x)  # (B, N_patches, D)
        if self.cls_token is not None:
            x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        x = x + self.pos_embed  # (B, N, D)
        batch_second = self.layout == "batch_second"
        if batch_second:
            x = x.transpose(0, 1).contiguous()  # (N, B, D)
        for block in self.blocks:
            x = block(x, batch_second)
        x = self.norm(x)  # identity for "pooled"
        tok = 0 if batch_second else 1
        if self.classifier == "token":
            x = x.select(tok, 0)  # (B, D)
        else:
            x = x.narrow(tok, self.num_prefix_tokens, x.shape[tok] - self.num_prefix_tokens).mean(dim=tok)
        x = self.fc_norm(x)  # identity for "token"
        return self.head(x)


def build(cfg):
    """A VisionTransformer from a fixture config (dict of python values, see make_fixtures.py)."""
    return VisionTransformer(
        image_height=cfg["image_height"], image_width=cfg["image_width"], channels=cfg["channels"],
        patch_size=cfg["patch_size"], dim=cfg["dim"], depth=cfg["depth"], heads=cfg["heads"],
        mlp_dim=cfg["mlp_dim"], num_classes=cfg["num_classes"], classifier=cfg["classifier"],
        layout=cfg["layout"], eps=cfg["eps"])


@torch.no_grad()
def init_params(model, seed):
    """Deterministic, deliberately non-trivial values, generated in float32.

    Linear/conv weights, cls_token, pos_embed: trunc_normal(std 0.02) as timm (timm's cls_token
    starts near 0; here it does not, so its gradient path is exercised). Biases: normal(std 0.02).
    LayerNorm: weight 1 + normal(std 0.02), bias normal(std 0.02), so neither is exactly 1 or 0.
    Parameters are visited in state_dict order from torch.manual_seed(seed).

    One deliberate exception: attn.qkv.weight uses std QKV_STD = 0.1. With 0.02 every attention
    probability is within ~8% of uniform (1/N) and the q/k rows of the qkv gradient are <2% of its
    largest entry, so softmax and the q.k path would hardly be tested; with 0.1 probabilities
    range over ~0.15/N..4.6/N.
    """
    torch.manual_seed(seed)
    norms = {n for n, m in model.named_modules() if isinstance(m, nn.LayerNorm)}
    for name, p in model.named_parameters():
        owner, _, leaf = name.rpartition(".")
        if owner in norms:
            p.copy_(torch.randn(p.shape) * 0.02 + (1.0 if leaf == "weight" else 0.0))
        elif leaf == "bias":
            p.copy_(torch.randn(p.shape) * 0.02)
        else:  # weights, cls_token, pos_embed; timm's bounds a=-2, b=2 (absolute)
            std = QKV_STD if name.endswith("attn.qkv.weight") else 0.02
            nn.init.trunc_normal_(p, std=std, a=-2.0, b=2.0)
    return model


def loss_fn(logits, labels, label_smoothing):
    return F.cross_entropy(logits, labels, label_smoothing=label_smoothing, reduction="mean")


def run(model, images, labels, label_smoothing):
    """Forward and backward; returns (logits, loss, {name: grad}) in the model's dtype."""
    model.zero_grad(set_to_none=True)
    logits = model(images)
    loss = loss_fn(logits, labels, label_smoothing)
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters()}
    return logits.detach(), loss.detach(), grads


def num_tokens(cfg):
    n = (cfg["image_height"] // cfg["patch_size"]) * (cfg["image_width"] // cfg["patch_size"])
    return n + (1 if cfg["classifier"] == "token" else 0)


def _mha_check(dtype=torch.float64):
    """Our Attention against torch's own nn.MultiheadAttention (sequence-first): an independent
    check of the (3, H, Dh) packing of qkv, the scale and the head concatenation."""
    torch.manual_seed(1)
    D, H, N, B = 12, 3, 5, 2
    ours = Attention(D, H).to(dtype)
    mha = nn.MultiheadAttention(D, H, bias=True).to(dtype)
    with torch.no_grad():
        mha.in_proj_weight.copy_(ours.qkv.weight)
        mha.in_proj_bias.copy_(ours.qkv.bias)
        mha.out_proj.weight.copy_(ours.proj.weight)
        mha.out_proj.bias.copy_(ours.proj.bias)
    x = torch.randn(N, B, D, dtype=dtype)
    want, _ = mha(x, x, x, need_weights=False)
    got_bs = ours(x, batch_second=True)
    got_bf = ours(x.transpose(0, 1), batch_second=False).transpose(0, 1)
    return max((got_bs - want).abs().max().item(), (got_bf - want).abs().max().item())


def self_test():
    """Sanity checks run before any fixture is written; raises on failure, returns a summary."""
    from torch.nn.utils.stateless import functional_call

    lines = []
    err = _mha_check()
    if err > 1e-12:
        raise AssertionError(f"Attention differs from nn.MultiheadAttention by {err}")
    lines.append(f"attention vs nn.MultiheadAttention (float64): max abs diff {err:.1e}")

    tiny = dict(image_height=4, image_width=6, channels=2, patch_size=2, dim=8, depth=2, heads=2,
                mlp_dim=12, num_classes=3, eps=1e-6)
    for classifier in CLASSIFIERS:
        for layout in LAYOUTS:
            cfg = dict(tiny, classifier=classifier, layout=layout)
            model = init_params(build(cfg), seed=3).double()
            # Larger weights than the fixtures so attention is far from uniform here.
            with torch.no_grad():
                for p in model.parameters():
                    if p.dim() > 1:
                        p.mul_(10.0)
            names = [n for n, _ in model.named_parameters()]
            params = tuple(p.detach().clone().requires_grad_(True) for p in model.parameters())
            torch.manual_seed(4)
            images = torch.randn(2, 2, 4, 6, dtype=torch.float64, requires_grad=True)
            labels = torch.tensor([2, 0])

            def f(images_, *ps):
                logits = functional_call(model, dict(zip(names, ps)), (images_,))
                return loss_fn(logits, labels, 0.1)

            ok = torch.autograd.gradcheck(f, (images,) + params, eps=1e-6, atol=1e-8, rtol=1e-6)
            if not ok:
                raise AssertionError(f"gradcheck failed for {classifier}/{layout}")
            lines.append(f"gradcheck float64 {classifier:6s} {layout:12s}: pass "
                         f"({len(names)} params + input, {sum(p.numel() for p in params)} values)")

    # Both layouts, same weights, same numbers.
    for classifier in CLASSIFIERS:
        cfg = dict(tiny, classifier=classifier, layout="batch_first")
        a = init_params(build(cfg), seed=5).double()
        b = build(dict(cfg, layout="batch_second")).double()
        b.load_state_dict(a.state_dict())
        torch.manual_seed(6)
        images = torch.randn(3, 2, 4, 6, dtype=torch.float64)
        labels = torch.tensor([1, 2, 0])
        la, lossa, ga = run(a, images, labels, 0.1)
        lb, lossb, gb = run(b, images, labels, 0.1)
        diff = max([(la - lb).abs().max().item(), (lossa - lossb).abs().item()]
                   + [(ga[n] - gb[n]).abs().max().item() for n in ga])
        if diff > 1e-13:
            raise AssertionError(f"batch_first and batch_second differ by {diff} ({classifier})")
        lines.append(f"batch_first vs batch_second float64 {classifier}: max abs diff {diff:.1e}")
    return lines


if __name__ == "__main__":
    for line in self_test():
        print(line)
