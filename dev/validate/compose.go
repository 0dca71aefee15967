package main

import (
	"context"
	"io"
	"path/filepath"

	"github.com/compose-spec/compose-go/v2/cli"
)

// compose loads the file as `docker compose` does (interpolation from the
// environment and the .env file beside it, schema validation, normalization)
// and writes the resulting project as JSON.
func compose(file string, out io.Writer) error {
	dir, err := filepath.Abs(filepath.Dir(file))
	if err != nil {
		return err
	}
	options, err := cli.NewProjectOptions(
		[]string{file},
		cli.WithWorkingDirectory(dir),
		cli.WithOsEnv,
		cli.WithEnvFiles(),
		cli.WithDotEnv,
		cli.WithConsistency(true),
		cli.WithResolvedPaths(false),
	)
	if err != nil {
		return err
	}
	project, err := options.LoadProject(context.Background())
	if err != nil {
		return err
	}
	data, err := project.MarshalJSON()
	if err != nil {
		return err
	}
	_, err = out.Write(append(data, '\n'))
	return err
}
