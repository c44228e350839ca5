from decentrain.models.factory import ModelConfig, build_model, build_tokenizer, save_model

__all__ = ["ModelConfig", "build_model", "build_tokenizer", "save_model"]
