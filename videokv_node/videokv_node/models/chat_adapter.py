"""What adapters of chat-tuned transformers Video-LLMs share: the Qwen chat prompt, option letters,
token embedding and decoding, last-token logits, query hooks and the weight fingerprint.

LLaVA-OneVision and Qwen2.5-VL both put a Qwen2-family decoder behind their vision
towers and use the same chat format; they differ in the vision path, in positions
(1-D RoPE vs mRoPE) and in the markers around the video, which the subclasses give.
"""

from __future__ import annotations

import hashlib
import json

import torch

from videokv_node.models.adapter import VideoLLMAdapter

SYSTEM_PROMPT = "You are a helpful assistant that remembers what the robot's cameras have seen."
OPTION_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


class ChatVideoLLMAdapter(VideoLLMAdapter):
    """Base of the transformers adapters. Subclasses set ``model``, ``tokenizer``, ``_lm`` (the decoder),
    ``_eos`` and ``_fingerprint`` in ``__init__``, and the two video markers below."""

    video_open = ""  # text between the user turn's opening and the first frame
    video_close = "\n"  # text between the last frame and the question

    # --- text -------------------------------------------------------------
    def text_ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def prefix_ids(self) -> list[int]:
        return self.text_ids(f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n{self.video_open}")

    def question_ids(self, question: str, options: list[str]) -> list[int]:
        text = f"{self.video_close}{question.strip()}"
        if options:
            lines = "\n".join(f"{OPTION_LETTERS[i]}. {opt.strip()}" for i, opt in enumerate(options))
            text += f"\n{lines}\nAnswer with the option's letter from the given choices directly."
        return self.text_ids(f"{text}<|im_end|>\n<|im_start|>assistant\n")

    def option_token_ids(self, n_options: int) -> list[int]:
        if n_options > len(OPTION_LETTERS):
            raise ValueError(f"at most {len(OPTION_LETTERS)} options")
        ids = []
        for letter in OPTION_LETTERS[:n_options]:
            tok = self.text_ids(letter)
            if len(tok) != 1:
                raise ValueError(f"option letter {letter!r} is not a single token for this tokenizer")
            ids.append(tok[0])
        return ids

    @torch.inference_mode()
    def embed_tokens(self, ids: list[int]) -> torch.Tensor:
        t = torch.tensor([ids], dtype=torch.long, device=self.device)
        return self.model.get_input_embeddings()(t)  # (1, n, hidden)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    @property
    def eos_token_ids(self) -> set[int]:
        return self._eos

    # --- decoder ----------------------------------------------------------
    def _last_logits(self, out) -> torch.Tensor:
        """(vocab,) logits of the last token, float32 (float64 for a float64 model, for parity tests)."""
        logits = self.model.lm_head(out.last_hidden_state[:, -1])[0]
        return logits if logits.dtype == torch.float64 else logits.float()

    def query_modules(self) -> list[torch.nn.Module]:
        return [layer.self_attn.q_proj for layer in self._lm.layers]

    # --- identity ---------------------------------------------------------
    def _fingerprint_config(self) -> dict:
        """The config as it identifies the model; subclasses drop what saving or loading changes."""
        config = self.model.config.to_dict()
        config.pop("_name_or_path", None)  # where the files lie is not what the model is
        return config

    def fingerprint(self) -> str:
        if self._fingerprint is None:
            h = hashlib.sha256(json.dumps(self._fingerprint_config(), sort_keys=True, default=str).encode())
            for name, p in sorted(self.model.state_dict().items()):
                h.update(name.encode())
                h.update(p.detach().flatten()[:64].float().cpu().numpy().tobytes())
            self._fingerprint = h.hexdigest()[:16]
        return self._fingerprint
