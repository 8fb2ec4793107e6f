"""Language-model, classifier and recurrent-depth wrappers around cemlib blocks."""

from cemlib.models.generation import GenerationMixin, generate
from cemlib.models.hyperset import HyperSETModel
from cemlib.models.lm import LanguageModel, LMConfig
from cemlib.models.newton_transformer import NewtonTransformer
from cemlib.models.nrgpt import GPTModel, NRGPTModel, RecurrentGPTModel
from cemlib.models.recurrent_transformer import RecurrentTransformer
from cemlib.models.regression import MLPRegressor
from cemlib.models.probes import DepthEnergies, energy_along_depth
from cemlib.models.params import count_parameters, flops_per_token, meta_model, table1_config, table1_report

__all__ = ["LMConfig", "LanguageModel", "generate", "GenerationMixin", "NRGPTModel", "RecurrentGPTModel", "GPTModel", "HyperSETModel",
           "RecurrentTransformer", "NewtonTransformer", "MLPRegressor",
           "DepthEnergies", "energy_along_depth", "count_parameters", "flops_per_token", "meta_model", "table1_config", "table1_report"]
