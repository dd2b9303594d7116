-- MLflow's store lives next to Ascent's database, in its own database.
CREATE DATABASE mlflow OWNER ascent;
