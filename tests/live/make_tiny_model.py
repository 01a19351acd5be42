"""Write a tiny random Llama model and a trained byte-level BPE tokenizer to a folder.

vLLM can serve it on CPU; its text is gibberish, but the server, its scheduler and
its /metrics are the real thing. Usage: python make_tiny_model.py OUT_DIR
"""
import os
import random
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, set_seed

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
random.seed(0)
set_seed(0)  # the weights too: the acceptance at temperature 0 depends on them
words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "speculative",
         "decoding", "draft", "verify", "token", "batch", "load", "latency"]
corpus = [" ".join(random.choice(words) for _ in range(40)) for _ in range(2000)]

tok = Tokenizer(models.BPE(unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=["<unk>", "<s>", "</s>"],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
tok.train_from_iterator(corpus, trainer)
fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                               unk_token="<unk>")
fast.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
fast.save_pretrained(out)

# head_dim must be one vLLM's CPU attention supports (64 works; 16 does not).
cfg = LlamaConfig(vocab_size=len(fast), hidden_size=128, intermediate_size=256,
                  num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                  max_position_embeddings=2048, bos_token_id=1, eos_token_id=2,
                  tie_word_embeddings=False, torch_dtype="float32")
LlamaForCausalLM(cfg).save_pretrained(out, safe_serialization=True)
print("wrote", out)
