"""What MLflow runs to load a logged model: the model logged as code ("models from code"), a copy
of this file in each model's artifacts, written by `serving.log_raw_row_model`.

A model logged as a Python object is pickled, and loading it unpickles whatever the artifact
store holds; MLflow warned so at every registration. Logged from this file, the model is the
class below, plain source a reviewer can read, and its state is its transform JSON, its network
program and its `model_config` (`TransformedNetwork.load_context`). MLflow runs this file once when
the model is logged and once in each process that loads it: nothing else imports it.
"""

from mlflow.models import set_model

from airflow_trainpipe.runtime.serving import TransformedNetwork

set_model(TransformedNetwork())
